"""``get_worker_info()``: which worker the calling code runs in, as in torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...datapipes.runtime import set_worker_info, worker_info

__all__ = ["WorkerInfo", "get_worker_info"]


@dataclass(frozen=True)
class WorkerInfo:
    """Facts about the worker running the current code.

    Attributes:
        id: the worker's index, ``0 <= id < num_workers``.
        num_workers: how many workers share the pipeline.
        seed: the worker's seed for this epoch.
        dataset: the worker's own copy of the pipeline.
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any = None


def get_worker_info() -> WorkerInfo | None:
    """The current worker's :class:`WorkerInfo`, or None in the main process/thread.

    Example:
        >>> get_worker_info() is None
        True
    """
    return worker_info()


def set_thread_worker_info(info: WorkerInfo | None) -> None:
    """Declare that the calling thread is a worker (used by thread reading services)."""
    set_worker_info(info, thread=True)


def set_process_worker_info(info: WorkerInfo | None) -> None:
    """Declare that this process is a worker (used by process reading services)."""
    set_worker_info(info, thread=False)
