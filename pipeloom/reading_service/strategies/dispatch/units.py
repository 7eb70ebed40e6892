"""What the dispatcher (``dispatcher.py``) keeps of its work and needs of its processes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ....errors import StateError
from ....events import ReadinessSource
from ...workers.messages import BatchSize, Task

__all__ = ["Unit", "WorkerPool", "refuse_keyed_resume"]


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


def refuse_keyed_resume(refuse: Any, source: Any) -> None:
    """Refuse a checkpoint of an epoch whose source made several items of one position.

    The dispatcher resumes at a position of the sharding point it reads, so a
    batch that ends inside one position's items (records ``(p, 0)`` and
    ``(p, 1)`` of the file at ``p``, more to come) cannot be resumed after:
    the rest of that position's items would be skipped or repeated.
    """
    if refuse:
        raise StateError(
            f"the sharding point {source!r} stamps several items of one position "
            f"(stamp_position(p, output=j)), and the economic and chunked strategies, "
            f"which read it in the main process, resume only at a position, so a "
            f"checkpoint between two of its items would skip or repeat the rest of that "
            f"position's items. Checkpoint this pipeline with strategy='classic' or "
            f"ThreadReadingService, which resume inside a position, or build the "
            f"DataLoader with resume_by_replay=True"
        )
