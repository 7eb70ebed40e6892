"""What each worker process does first, so user code sees torch's worker conventions."""

from __future__ import annotations

import random
from collections.abc import Callable
from multiprocessing.reduction import DupFd
from typing import Any

import numpy as np
import torch
import torch.utils.data._utils.worker as torch_worker

from ..datapipes import DataPipe, Mapper
from ..graph import upstream as upstream_blocks
from ..reading_service import get_worker_info
from ._fetch import Fetch, GetItem, IterableDatasetSource
from ._plan import PlanBoard
from ._plan_source import PlanSource

__all__ = ["WorkerSetup", "find_dataset"]


class WorkerSetup:
    """The ``worker_init_fn`` the compat loader gives its reading service.

    In each worker process, before the user's ``worker_init_fn(worker_id)``:

    1. points the worker's plan sources at the shared plan board;
    2. seeds ``random``, torch and NumPy as torch's ``_worker_loop`` does
       (``base_seed + worker_id``; NumPy from ``_generate_state``);
    3. sets torch's own worker info, so ``torch.utils.data.get_worker_info()``
       returns ``WorkerInfo(id, num_workers, seed, dataset)`` with ``dataset``
       this worker's copy of the dataset -- the object it iterates.

    ``base_seed`` is set by the main process before workers start.

    Example:
        >>> setup = WorkerSetup(PlanBoard(), dataset=None, user_fn=None)
        >>> setup.base_seed = 5
        >>> setup
        WorkerSetup(user_fn=None)
    """

    def __init__(
        self, board: PlanBoard, dataset: Any, user_fn: Callable[[int], None] | None
    ) -> None:
        self.board = board
        self.dataset = dataset
        self.user_fn = user_fn
        self.base_seed = 0

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        pipe = info.dataset if info is not None else None
        num_workers = info.num_workers if info is not None else 1
        dataset = self.dataset
        if isinstance(pipe, DataPipe):
            for block in upstream_blocks(pipe):
                if isinstance(block, (PlanSource, IterableDatasetSource)):
                    block.attach(self.board.area, self.board.wake_fd)
            found = find_dataset(pipe)
            dataset = found if found is not None else dataset
        seed = self.base_seed + worker_id
        random.seed(seed)
        torch.manual_seed(seed)
        np.random.seed(torch_worker._generate_state(self.base_seed, worker_id))
        torch_worker._worker_info = torch_worker.WorkerInfo(
            id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset
        )
        if self.user_fn is not None:
            self.user_fn(worker_id)

    def __getstate__(self) -> dict[str, Any]:
        # Sent to spawned workers: the board's shared area travels by handle
        # (multiprocessing's pickler); the dataset is found in the worker's pipeline.
        fd = self.board.wake_fd
        return {
            "area": self.board.area,
            "wake_fd": None if fd is None else DupFd(fd),
            "user_fn": self.user_fn,
            "base_seed": self.base_seed,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.board = PlanBoard()
        fd = state.get("wake_fd")
        self.board.attach(state["area"], None if fd is None else fd.detach())
        self.dataset = None
        self.user_fn = state["user_fn"]
        self.base_seed = state["base_seed"]

    def __repr__(self) -> str:
        name = None if self.user_fn is None else getattr(self.user_fn, "__qualname__", "fn")
        return f"WorkerSetup(user_fn={name})"


def find_dataset(pipe: DataPipe) -> Any:
    """The user's dataset inside a compat pipeline (a worker's copy of it), or None."""
    for block in upstream_blocks(pipe):
        if isinstance(block, IterableDatasetSource):
            return block.dataset
        if isinstance(block, Mapper) and isinstance(block.fn, (Fetch, GetItem)):
            return block.fn.dataset
    return None
