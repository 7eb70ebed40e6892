"""Merge the workers' outputs by the position of their source items.

Each worker sends ``(position, draws, item)`` triples (``draws``: item seeds
already drawn for the item, so ``item_rng()`` continues where it was) in increasing position order,
then :data:`END`. Position ``p`` belongs to worker ``(p // group_size) %
num_workers``. The merge walks positions in order and asks only the owner of
the current position, so the result is the in-process order whatever the
timing; a worker whose next output is past ``p`` has dropped ``p`` (e.g. a
``filter``), and several outputs at ``p`` (a ``flatmap``) come out together.
With ``in_order=False`` outputs are taken from whichever worker has one ready.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ..datapipes import IterDataPipe
from ..datapipes._context import restore_stamp
from ..errors import NotAvailable
from ..events import ReadinessSource
from ._failure import Failure

__all__ = ["END", "WorkerChannel", "WorkerMerge"]


class _End:
    """Sent by a worker after its last item of the epoch."""

    def __reduce__(self):
        return "END"

    def __repr__(self) -> str:
        return "END"


END = _End()


class WorkerChannel(Protocol):
    """The main process's view of one worker's output."""

    def get_nowait(self) -> Any:
        """The next message, or raise ``NotAvailable``; raises if the worker died."""

    def readiness(self) -> Sequence[ReadinessSource]:
        """Where to wait for the next message (or for the worker's death)."""


class WorkerMerge(IterDataPipe):
    """The workers' outputs as one stream, in source-position order."""

    def __init__(
        self,
        channels: Sequence[WorkerChannel],
        *,
        group_size: int = 1,
        in_order: bool = True,
        seed: int | None = None,
        epoch: int = 0,
        start_position: int = 0,
    ) -> None:
        self.channels = list(channels)
        self.group_size = group_size
        self.in_order = in_order
        self._stamp_seed = seed
        self._stamp_epoch = epoch
        self._position = start_position
        self._heads: list[Any] = [None] * len(self.channels)
        self._ended = [False] * len(self.channels)
        self._next_channel = 0
        self.delivered = 0

    def readiness_sources(self) -> Sequence[ReadinessSource]:
        return [source for channel in self.channels for source in channel.readiness()]

    def async_next(self) -> Any:
        if self.in_order:
            position, draws, item = self._next_in_order()
        else:
            position, draws, item = self._next_any()
        restore_stamp((self._stamp_seed, self._stamp_epoch, position, draws))
        self.delivered += 1
        return item

    def _head(self, worker: int) -> Any:
        head = self._heads[worker]
        if head is None:
            head = self.channels[worker].get_nowait()  # NotAvailable propagates
            if isinstance(head, Failure):
                head.raise_here()
            if head is END or (isinstance(head, _End)):
                self._ended[worker] = True
                head = END
            self._heads[worker] = head
        return head

    def _next_in_order(self) -> tuple[int, int, Any]:
        workers = len(self.channels)
        while True:
            if all(self._ended) and all(h is END or h is None for h in self._heads):
                raise StopIteration
            position = self._position
            owner = (position // self.group_size) % workers
            head = self._head(owner)
            if head is END:
                self._position = position + 1
                continue
            if head[0] > position:
                self._position = position + 1
                continue
            self._heads[owner] = None
            return head

    def _next_any(self) -> tuple[int, int, Any]:
        workers = len(self.channels)
        for offset in range(workers):
            worker = (self._next_channel + offset) % workers
            if self._ended[worker]:
                continue
            try:
                head = self._head(worker)
            except NotAvailable:
                continue
            if head is END:
                continue
            self._heads[worker] = None
            self._next_channel = (worker + 1) % workers
            return head
        if all(self._ended):
            raise StopIteration
        raise NotAvailable

    def state_dict(self) -> dict[str, Any]:
        return {"delivered": self.delivered}

    def __repr__(self) -> str:
        return f"WorkerMerge(workers={len(self.channels)}, in_order={self.in_order})"
