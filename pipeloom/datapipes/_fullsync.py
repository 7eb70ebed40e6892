"""``fullsync``: end the epoch on every rank of a distributed job at the same step.

When each rank reads its own shard, the shards may differ by a few items; a
rank that runs out first would leave the others waiting forever in their
next collective (a gradient all-reduce). ``fullsync()`` at the end of the
pipeline makes every rank stop when the first one runs out: before each item
the ranks sum ``[has an item, failed]`` (one small all-reduce on a gloo group
of its own), exactly as ``DistributedReadingService(end_check="step")``
agrees on the end, and an error on one rank stops the others at once.

``DistributedReadingService`` already ends every epoch this way, so with it
``fullsync()`` is redundant (harmless: it agrees on the same step; it costs
one all-reduce per item). It is for pipelines sharded by hand across
``torch.distributed`` ranks. Without a process group, or with one rank, it
passes the items through.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

from ._base import IterDataPipe

__all__ = ["FullSync", "RankStopped"]


class RankStopped(RuntimeError):
    """Another rank failed while reading its shard, so this rank stops too."""


class FullSync(IterDataPipe):
    """Yield items while every rank still has one (functional: ``fullsync``).

    Put it last (after ``batch``/``collate``): it runs where the loader hands
    items to the training loop, never in worker processes.

    Args:
        source: the upstream block (this rank's shard).
        timeout: seconds a rank waits for the others at each step before
            raising (torchdata's default: 1800).

    Raises (while iterating):
        RankStopped: another rank raised an error (its own output has it).
        RuntimeError: a collective failed or timed out (a rank crashed or
            stopped iterating).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper(range(3)).fullsync())  # one process: items pass through
        [0, 1, 2]
    """

    inputs = ("source",)
    one_to_one = True
    per_rank_fields = ("timeout",)  # may differ between ranks (``_rank_pipelines``)

    def __init__(self, source: IterDataPipe, timeout: float = 1800) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        self.source = source
        self.timeout = timeout
        self._group: Any = None
        self._world = 0  # 0: not decided yet this process
        self._ended = False

    def reset(self) -> None:
        self._ended = False

    def _world_size(self) -> int:
        if self._world == 0:
            if dist.is_available() and dist.is_initialized():
                self._world = dist.get_world_size()
            else:
                self._world = 1
            if self._world > 1:  # a collective: every rank creates it at its first item
                self._group = dist.new_group(
                    backend="gloo", timeout=datetime.timedelta(seconds=self.timeout)
                )
        return self._world

    def async_next(self) -> Any:
        world = self._world_size()
        if world == 1:
            return self.source.async_next()
        if self._ended:  # the ranks agreed: no more collectives this epoch
            raise StopIteration
        has, failure, item = 0, None, None
        try:
            item, has = self.source.async_next(), 1
        except StopIteration:
            pass
        except Exception as error:  # noqa: BLE001 - told to the other ranks, then raised
            failure = error
        failing, rank = int(failure is not None), dist.get_rank()
        flags = torch.tensor([has, failing, failing * rank], dtype=torch.int64)
        try:
            dist.all_reduce(flags, group=self._group)
        except RuntimeError as error:
            raise RuntimeError(
                f"fullsync(): rank {dist.get_rank()} of {world} could not agree on the next "
                f"step with the others (waited at most {self.timeout:g} s): another rank "
                f"crashed, stopped iterating or is stuck; look for its error"
            ) from error
        have, failed, which = (int(v) for v in flags.tolist())
        if failure is not None:
            raise failure
        if failed:
            who, whose = (f"rank {which}", "its") if failed == 1 else (f"{failed} ranks", "their")
            raise RankStopped(
                f"fullsync(): {who} raised an error while reading {whose} shard, so rank {rank} "
                f"stops too; {whose} output has the error"
            )
        if have < world:
            self._ended = True
            raise StopIteration
        return item

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_group"], state["_world"] = None, 0  # a copy joins the job where it runs
        return state

    def __repr__(self) -> str:
        return f"FullSync(timeout={self.timeout:g})"
