"""One rank's epoch: its shard's items, ended together with the other ranks.

Every rank must yield the same number of items per epoch (a training step per
item, with collectives inside), and no rank may wait forever for another.
Two ways to agree on the count:

- by length (``target`` given): every rank's pipeline has a ``len()``; the
  ranks exchanged them once at the start, so each yields exactly ``target``
  items with no further communication;
- by step (``target`` None): before each item the ranks sum
  ``[has an item, failed, the failed rank, cannot pad]`` (one small
  all-reduce), so they stop at the same step, and an exception on one rank
  stops the others at once, naming that rank.

``uneven="shortest"`` stops when the first rank runs out (the others drop
what is left of their shards); ``"pad"`` goes on until the last rank runs out,
the others repeating their own shard from its start.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ...errors import DistributedError
from .job import Job

__all__ = ["Progress", "RankEpoch"]


@dataclass
class Progress:
    """How far a rank is in its epoch; part of its checkpoint.

    Attributes:
        delivered: items this rank yielded this epoch.
        own: of which from the first pass over its shard (the rest are padding).
        padding: True once the rank repeats its shard (a pad pass is running).
    """

    delivered: int = 0
    own: int = 0
    padding: bool = False


class RankEpoch:
    """The items of one epoch on one rank (see the module docstring).

    ``start(state)`` starts (or resumes) a pass over this rank's shard and
    returns its items; it is called again to repeat the shard for padding.
    """

    def __init__(
        self,
        start: Callable[[dict[str, Any] | None], Iterator[Any]],
        job: Job,
        *,
        uneven: str,
        target: int | None,
        progress: Progress,
        state: dict[str, Any] | None,
    ) -> None:
        self._start = start
        self.job = job
        self.uneven = uneven
        self.target = target
        self.progress = progress
        # resumed on another number of ranks: the own items this rank had before the rest
        self._own_before_rest = progress.own if state is not None and "rest" in state else None
        self._items = start(state)

    def __iter__(self) -> Iterator[Any]:
        next_item = self._next_by_length if self.target is not None else self._next_by_step
        try:
            while True:
                try:
                    item = next_item()
                except StopIteration:
                    return
                self.progress.delivered += 1
                yield item
        finally:
            self.close()

    def close(self) -> None:
        """Stop the running pass (e.g. the others ran out first)."""
        close = getattr(self._items, "close", None)
        if close is not None:
            close()

    def _next_by_length(self) -> Any:
        progress = self.progress
        assert self.target is not None
        if progress.delivered >= self.target:
            raise StopIteration
        if not progress.padding:
            try:
                item = next(self._items)
            except StopIteration:
                if self.uneven == "shortest":
                    raise RuntimeError(
                        f"rank {self.job.rank}'s pipeline ended after {progress.own} items, "
                        f"but its len() promised at least {self.target}; fix the __len__ of "
                        f"a block, or use end_check='step' (agrees on the end at every item)"
                    ) from None
            else:
                progress.own += 1
                return item
        return self._next_pad()

    def _next_by_step(self) -> Any:
        progress = self.progress
        has, item, failure = 0, None, None
        if not progress.padding:
            try:
                item, has = next(self._items), 1
            except StopIteration:
                pass
            except Exception as error:  # noqa: BLE001 - told to the other ranks, then raised
                failure = error
        empty = int(self.uneven == "pad" and not has and progress.own == 0 and failure is None)
        failing = int(failure is not None)
        have, failed, which, empties = self.job.sum([has, failing, failing * self.job.rank, empty])
        if failure is not None:
            raise failure
        if failed:
            if failed == 1:
                who, whose = f"rank {which} raised an error while loading its", f"rank {which}'s"
            else:
                who, whose = f"{failed} other ranks raised an error while loading their", "their"
            raise DistributedError(
                f"{who} shard, so rank {self.job.rank} stops too; {whose} output has the error"
            )
        if have == 0 or (self.uneven == "shortest" and have < self.job.world_size):
            raise StopIteration
        if empties:
            raise ValueError(_empty_shard_message(empties, self.job.world_size))
        if has:
            progress.own += 1
            return item
        try:
            return self._next_pad()
        except Exception:  # the others meet this rank at their next step: tell them there
            with contextlib.suppress(DistributedError):
                self.job.sum([0, 1, self.job.rank, 0])
            raise

    def _next_pad(self) -> Any:
        """The next item of a pass repeating this rank's shard from its start."""
        for _ in range(2):  # at most one fresh pass: the shard is not empty
            if self.progress.padding:
                try:
                    return next(self._items)
                except StopIteration:
                    pass
            self.close()
            self.progress.padding = True
            self._items = self._start(None)
        if self.progress.own == self._own_before_rest:
            raise ValueError(
                f"rank {self.job.rank} has no items of the rest of this epoch (resumed on "
                f"{self.job.world_size} ranks), and its shard of a whole epoch on "
                f"{self.job.world_size} ranks is empty too, so uneven='pad' has nothing to "
                f"repeat; resume with uneven='shortest' or on fewer ranks"
            )
        raise RuntimeError(
            f"rank {self.job.rank} yielded {self.progress.own} items in its first pass, but a "
            f"second pass over its shard yields none; the pipeline must be deterministic "
            f"(given the seed and epoch) to pad with uneven='pad'"
        )


def check_start(rows: list[list[int]], *, uneven: str, end_check: str) -> int | None:
    """Check what every rank reported at the epoch's start; return the length target.

    ``rows[rank]`` is ``[epoch, length (-1: unknown), delivered, failed, ...]`` (the
    service checks the rest: the digest of the rank's pipeline).
    """
    failed = [rank for rank, row in enumerate(rows) if row[3]]
    if failed:
        raise DistributedError(
            f"rank(s) {failed} failed to start the epoch (computing len() of their pipeline); "
            f"their output has the error"
        )
    epochs = sorted({row[0] for row in rows})
    if len(epochs) > 1:
        raise ValueError(
            f"the ranks start different epochs ({', '.join(str(r[0]) for r in rows)}, by rank);"
            f" call set_epoch() with the same value on every rank"
        )
    delivered = sorted({row[2] for row in rows})
    if len(delivered) > 1:
        raise ValueError(
            f"the ranks resume from different steps ({', '.join(str(r[2]) for r in rows)} "
            f"items delivered, by rank); save every rank's state_dict() at the same step"
        )
    lengths = [row[1] for row in rows]
    if min(lengths) < 0:
        if end_check == "length":
            unknown = [rank for rank, length in enumerate(lengths) if length < 0]
            raise ValueError(
                f"end_check='length' needs len() of every rank's pipeline, but rank(s) "
                f"{unknown} have none (a filter, or a source of unknown size); use "
                f"end_check='auto' or 'step'"
            )
        return None
    if uneven == "shortest":
        return min(lengths)
    if max(lengths) > 0 and min(lengths) == 0:
        raise ValueError(_empty_shard_message(lengths.count(0), len(lengths)))
    return max(lengths)


def _empty_shard_message(empty: int, world: int) -> str:
    return (
        f"{empty} of {world} ranks have an empty shard, so uneven='pad' has nothing to "
        f"repeat there; use uneven='shortest', fewer ranks, or more data (at least one "
        f"item, or one sharding group, per rank)"
    )
