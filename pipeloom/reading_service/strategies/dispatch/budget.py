"""How many chunks may be in flight when a chunk's outputs are not known in advance.

Chunked hands out chunks of ``chunk_size`` sharding-point inputs and keeps
about ``prefetch`` batches' worth of them in flight. When an input makes one
output (or none) that is a fixed number of chunks; when it may make many --
a tar shard read into its samples, a ``flatmap`` -- a chunk of one shard
can hold thousands of decoded samples, and the same number of chunks would
hold that many times more memory than the loader was asked to prefetch
(measured before this budget: a chunked tar loader held nearly the whole
dataset's decoded samples ahead of a slow consumer, where classic held
``prefetch_factor`` batches per worker).

So the budget measures the batches a chunk completes on average and keeps
in flight the chunks that make ``prefetch`` batches -- but never fewer than
one per item worker plus one, which every worker needs to run beside the
others (each decodes a whole shard: that, times the workers, is the floor
of chunked's memory with large shards), and never more than planned.
"""

from __future__ import annotations

import math

__all__ = ["ChunkBudget"]


class ChunkBudget:
    """The chunks in flight for ``batches_ahead`` batches, from the batches chunks made.

    ``batches_ahead=None``: always ``max_units`` (each chunk makes at most its size).

    Example:
        >>> budget = ChunkBudget(max_units=64, batches_ahead=2)
        >>> budget.workers = 2
        >>> budget.limit()  # nothing measured yet: one chunk per worker and one more
        3
        >>> budget.record(batches=31, chunks=1)  # a shard of about 1,000 samples, batch 32
        >>> budget.limit()
        3
        >>> budget.record(batches=0, chunks=60)  # 61 shards of about 16 samples each
        >>> budget.limit()
        4
    """

    def __init__(self, *, max_units: int, batches_ahead: int | None) -> None:
        self.max_units = max_units
        self.batches_ahead = batches_ahead
        self.workers = 1
        self._chunks = 0  # chunks finished over the loader's life
        self._batches = 0  # and the batches they completed

    def record(self, *, batches: int, chunks: int) -> None:
        """Count ``batches`` made by ``chunks`` more finished chunks."""
        self._batches += batches
        self._chunks += chunks

    def limit(self) -> int:
        """Chunks in flight at most now."""
        if self.batches_ahead is None:
            return self.max_units
        floor = min(self.workers + 1, self.max_units)
        if not self._chunks:
            return floor
        if not self._batches:  # no chunk completed a batch on its own: small chunks
            return self.max_units
        wanted = math.ceil(self.batches_ahead * self._chunks / self._batches)
        return max(floor, min(wanted, self.max_units))
