"""This process's place in a ``torch.distributed`` job, and the few collectives the loader uses.

:func:`join_job` finds (or, from ``torchrun``'s environment, creates) the
process group, then opens a gloo group of the loader's own: CPU tensors work
whatever the model's backend, its timeout bounds every wait, and the loader's
collectives never interleave with the model's. A failed collective (a rank
crashed, raised or is stuck past the timeout) raises :class:`DistributedError`.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ...errors import DistributedError

__all__ = ["ENVIRONMENT", "Job", "join_job"]

ENVIRONMENT = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


@dataclass
class Job:
    """Rank ``rank`` of ``world_size``, talking on ``group`` (None when alone).

    Example:
        >>> Job(rank=0, world_size=1, group=None, timeout=60.0).broadcast(7)
        7
    """

    rank: int
    world_size: int
    group: Any
    timeout: float
    owns_group: bool = False

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank."""
        if self.world_size == 1:
            return value
        box = [value]
        self._call("receive rank 0's value", dist.broadcast_object_list, box, group_src=0)
        return box[0]

    def gather(self, values: list[int]) -> list[list[int]]:
        """Every rank's ``values`` (ints), indexed by rank."""
        mine = torch.tensor(values, dtype=torch.int64)
        if self.world_size == 1:
            return [values]
        rows = [torch.empty_like(mine) for _ in range(self.world_size)]
        self._call("exchange the epoch's start", dist.all_gather, rows, mine)
        return [row.tolist() for row in rows]

    def gather_objects(self, value: Any, what: str) -> list[Any]:
        """Every rank's picklable ``value``, indexed by rank (``what``: for the error)."""
        if self.world_size == 1:
            return [value]
        values: list[Any] = [None] * self.world_size
        self._call(what, dist.all_gather_object, values, value)
        return values

    def sum(self, values: list[int]) -> list[int]:
        """The element-wise sum of every rank's ``values`` (ints)."""
        if self.world_size == 1:
            return values
        tensor = torch.tensor(values, dtype=torch.int64)
        self._call("agree whether the epoch goes on", dist.all_reduce, tensor)
        return tensor.tolist()

    def close(self) -> None:
        """Release the loader's own group (the job's default group stays)."""
        if self.owns_group and self.group is not None:
            self.owns_group = False
            try:
                dist.destroy_process_group(self.group)
            except (RuntimeError, ValueError):  # already gone with the default group
                pass

    def _call(self, what: str, collective: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        try:
            collective(*args, group=self.group, **kwargs)
        except RuntimeError as error:  # gloo: peer closed the connection, or timed out
            raise DistributedError(
                f"rank {self.rank} of {self.world_size} could not {what}: another rank "
                f"crashed, raised an error or stopped iterating (waited at most "
                f"{self.timeout:g} s, the loader's timeout). Look for the first error in the "
                f"other ranks' output; every rank must iterate the loader the same way"
            ) from error


def join_job(group: Any | None, timeout: float) -> Job:
    """This process's place in the job (see the module docstring).

    Raises:
        RuntimeError: no process group and no ``torchrun`` environment.
        ValueError: ``group`` cannot carry CPU tensors.
    """
    if group is not None:
        backend = dist.get_backend(group)
        if backend != "gloo":
            raise ValueError(
                f"group must be a gloo process group (the loader exchanges CPU tensors), got "
                f"backend {backend!r}; pass torch.distributed.new_group(backend='gloo') or "
                f"leave group=None to get one"
            )
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        return Job(rank, world, group if world > 1 else None, timeout)
    if not dist.is_initialized():
        if os.environ.get("WORLD_SIZE") == "1":
            return Job(0, 1, None, timeout)
        missing = [name for name in ENVIRONMENT if name not in os.environ]
        if missing:
            raise RuntimeError(
                f"DistributedReadingService needs a torch.distributed process group, but none "
                f"is initialized and the environment lacks {', '.join(missing)}. Launch with "
                f"torchrun (e.g. `torchrun --nproc_per_node=2 train.py`), which sets "
                f"{', '.join(ENVIRONMENT)}; set them yourself; or call "
                f"torch.distributed.init_process_group() before creating the DataLoader"
            )
        dist.init_process_group(
            backend="gloo", init_method="env://", timeout=datetime.timedelta(seconds=timeout)
        )
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        return Job(rank, 1, None, timeout)
    try:  # a collective: every rank creates its loader's group
        own = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
    except RuntimeError as error:
        raise DistributedError(
            f"rank {rank} of {world} could not open the loader's process group: another rank "
            f"crashed or did not create its DataLoader within {timeout:g} s (the loader's "
            f"timeout); every rank must create the same DataLoaders in the same order"
        ) from error
    return Job(rank, world, own, timeout, owns_group=True)
