"""The main process's side of assembled batches: whole batches, run after run.

Workers that build batches of items they cannot count in advance
(``assemble.py``) send, for each run of positions they make, its whole
batches ``(key, draws, batch, (position, skip))`` and then a
:class:`~...workers.messages.RunDone`. Run ``i`` is worker ``i % n``'s, so
reading the owner of the current run until its ``RunDone`` gives the batches
in their in-process order; the main process does one message's work per
batch. The checkpoint is where a resume starts: ``(position, skip)`` after
the last batch delivered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ....datapipes import IterDataPipe, StateFields
from ....datapipes.runtime import restore_stamp
from ....events import ReadinessSource
from ...workers.failure import Failure
from ...workers.messages import END, RunDone
from .merge import WorkerChannel

__all__ = ["BatchMerge"]


class BatchMerge(IterDataPipe):
    """The workers' whole batches as one stream, in run order."""

    inputs = ()
    restartable = False  # its stream is produced once per epoch
    #: It stands in for the sharding point, which ran in the workers: a shardable block
    #: after the merge (a redundant ``sharding_filter()``) keeps the workers' positions
    #: instead of numbering the merged stream again, as it does in-process.
    stands_in_for_sharding_point = True

    def __init__(self, *, run_size: int) -> None:
        self.run_size = run_size
        self.channels: list[WorkerChannel] = []
        self._stamp_seed: int | None = None
        self._stamp_epoch = 0
        self.reset()

    def attach(self, channels: Sequence[WorkerChannel], *, seed: int | None, epoch: int) -> None:
        """Read this epoch from ``channels``, stamping batches with ``seed`` and ``epoch``."""
        self.channels = list(channels)
        self._ended = [False] * len(self.channels)
        self._stamp_seed, self._stamp_epoch = seed, epoch
        self._run = self._after[0] // self.run_size

    def reset(self) -> None:
        self._after = (0, 0)  # (position, skip): where a resume starts
        self._run = 0
        self._final = False
        self._failing = False
        self._ended = [False] * len(self.channels)

    def readiness_sources(self) -> Sequence[ReadinessSource]:
        return [source for channel in self.channels for source in channel.readiness()]

    def _get(self, worker: int) -> Any:
        message = self.channels[worker].get_nowait()  # NotAvailable propagates
        if isinstance(message, Failure):
            message.raise_here()
        if message is END:
            self._ended[worker] = True
        return message

    def async_next(self) -> Any:
        if self._failing:
            self._find_failure()
        while not self._final:
            owner = self._run % len(self.channels)
            message = self._get(owner)
            if isinstance(message, RunDone):
                self._run += 1
                self._final = message.final
                continue
            if message is END:  # ended before its run: another worker failed
                self._failing = True
                self._find_failure()
            key, draws, batch, after = message
            self._after = after
            restore_stamp((self._stamp_seed, self._stamp_epoch, key, draws))
            return batch
        for worker in range(len(self.channels)):  # every worker's END
            while not self._ended[worker]:
                self._get(worker)
        raise StopIteration

    def _find_failure(self) -> None:
        """Raise the failure another worker sent (it stopped the others' runs)."""
        for worker in range(len(self.channels)):
            while not self._ended[worker]:
                self._get(worker)  # a Failure raises; NotAvailable waits for more
        raise RuntimeError(
            "the workers ended the epoch before its last batch without reporting an "
            "error; this is a bug in pipeloom, please report it"
        )

    @property
    def exhausted(self) -> bool:
        """True once every worker's END was read."""
        return all(self._ended)

    @property
    def resume_position(self) -> int:
        return self._after[0]

    @property
    def resume_skip(self) -> int:
        return self._after[1]

    def state_dict(self) -> dict[str, Any]:
        position, skip = self._after
        return {"position": position, "skip": skip}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        self._after = (fields.int("position"), fields.int("skip"))

    def __repr__(self) -> str:
        return f"BatchMerge(workers={len(self.channels)}, run_size={self.run_size})"
