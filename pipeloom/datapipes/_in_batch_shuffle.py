"""``in_batch_shuffle``: shuffle the items inside each batch."""

from __future__ import annotations

import random
from typing import Any

from ._base import IterDataPipe
from ._context import current_stamp, derive_seed
from ._state_fields import StateFields

__all__ = ["InBatchShuffler"]


class InBatchShuffler(IterDataPipe):
    """Shuffle the items of each batch (functional name: ``in_batch_shuffle``).

    Each batch (a list or tuple) is copied and shuffled; the input batch is not
    modified, and a tuple stays a tuple. A batch's order depends only on the
    seed (the pipeline's, or ``seed=``), the epoch and the batch's stamp (the
    key of its first item, see ``item_rng``), so it is the same under every
    reading service and the block keeps no state between batches: a
    checkpoint after it resumes on any number of ranks. (A batch without a
    stamp, from a custom source that stamps none, is shuffled by a running
    generator instead.)

    Args:
        source: a block yielding batches.
        seed: this block's own seed; None follows the pipeline seed.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> dp = IterableWrapper([[0, 1, 2, 3], [4, 5]]).in_batch_shuffle(seed=0)
        >>> [sorted(batch) for batch in dp]
        [[0, 1, 2, 3], [4, 5]]
    """

    inputs = ("source",)

    def __init__(self, source: IterDataPipe, *, seed: int | None = None) -> None:
        self.use_own_seed(seed)
        self.source = source
        self.seed = seed
        self._rng: random.Random | None = None  # only for batches without a stamp

    def reset(self) -> None:
        self._rng = None

    def async_next(self) -> Any:
        batch = self.source.async_next()
        rng = self._batch_rng()
        if type(batch) is list:
            shuffled = batch.copy()
            rng.shuffle(shuffled)
            return shuffled
        if not isinstance(batch, (list, tuple)):
            raise TypeError(
                f"in_batch_shuffle() shuffles batches that are lists or tuples, got a "
                f"{type(batch).__name__}; put .batch(n) before .in_batch_shuffle()"
            )
        shuffled = list(batch)
        rng.shuffle(shuffled)
        return tuple(shuffled) if isinstance(batch, tuple) else type(batch)(shuffled)

    def _batch_rng(self) -> random.Random:
        """The generator for the batch just pulled: from its stamp's key (no state kept)."""
        key = current_stamp()[2]
        if key is None:  # no stamp to key it by: a running generator (the block's state)
            if self._rng is None:
                self._rng = random.Random(self.epoch_seed())
            return self._rng
        if key.__class__ is tuple:
            return random.Random(derive_seed(self.epoch_seed(), *key))  # type: ignore[misc]
        return random.Random(derive_seed(self.epoch_seed(), key))  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        if self._rng is None:  # stamped batches: nothing kept between batches
            return {}
        return {"rng": self._rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rng = StateFields(self, state).rng("rng", default=None)

    def __repr__(self) -> str:
        return f"InBatchShuffler(seed={self.seed!r})"
