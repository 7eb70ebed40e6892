"""What the dispatcher (``dispatcher.py``) keeps of its work and needs of its processes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ....events import ReadinessSource
from ...workers.messages import BatchSize, Task

__all__ = ["Unit", "WorkerPool"]


class WorkerPool(Protocol):
    """What the dispatcher needs from the processes (see ``pool.py``)."""

    num_item_workers: int
    num_batch_workers: int

    def send_task(self, worker: int, message: Task) -> None: ...

    def send_control(self, worker: int, message: BatchSize) -> None: ...

    def receive(self) -> list[Any]:
        """Every message the workers sent to the main process so far (non-blocking)."""

    def check_alive(self) -> None:
        """Raise ``WorkerError`` if a worker died."""

    def readiness(self) -> Sequence[ReadinessSource]: ...


@dataclass
class Unit:
    """A batch (economic) or a chunk (chunked) on its way through the workers."""

    id: int
    batch_worker: int
    size: int  # items it takes
    chunk: bool = False  # a chunk of the first batch, which the main process builds
    final: bool = False  # relayed: the empty chunk that builds the short last batch
    positions: list[int] = field(default_factory=list)
    item_workers: list[tuple[int, int]] = field(default_factory=list)  # (worker, items)
    start: tuple[int, int] = (0, 0)  # its first item: position, items of it before
    end: tuple[int, int, int] = (0, 0, 0)  # the resume point after it (resume_point.py)
