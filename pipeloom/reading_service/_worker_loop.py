"""What a worker (thread or process) does for one epoch."""

from __future__ import annotations

import ctypes
import ctypes.util
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..datapipes import (
    BlockingReader,
    DataPipe,
    IterDataPipe,
    current_position,
    reset_pipeline,
    set_pipeline_epoch,
)
from ..datapipes.runtime import current_draws, current_stamp, derive_seed, restore_stamp
from ..errors import QueueError
from ..graph import traverse
from ._failure import capture_failure
from ._merge import END

__all__ = [
    "EpochCancelled",
    "apply_sharding",
    "keep_freed_memory_for_reuse",
    "produce_epoch",
    "seed_item_rngs",
    "seed_worker_rngs",
    "worker_seed",
]


def worker_seed(seed: int, epoch: int, worker_id: int) -> int:
    """The seed of worker ``worker_id`` in ``epoch``: distinct per worker and epoch."""
    return derive_seed(seed, epoch, worker_id, 0x3EED)


def seed_worker_rngs(seed: int) -> None:
    """Seed ``random``, NumPy's legacy global RNG and torch in this worker."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


_MALLOC_KEEP = 1 << 30  # M_MMAP_THRESHOLD and M_TRIM_THRESHOLD for worker processes


def keep_freed_memory_for_reuse() -> bool:
    """Make glibc's malloc reuse freed large blocks in this (worker) process.

    By default glibc gives every block over 32 MiB its own ``mmap`` and
    returns it on ``free``, so a worker that collates a 128 MiB batch touches
    128 MiB of fresh pages each time (a page fault per 4 KiB: ~130 ms on the
    reference VM, more than the work). Raising the thresholds keeps such blocks
    in the heap for the next batch: 2-4x the throughput on 128 MiB batches, for
    about one batch of items and one collated batch of private memory kept per
    worker between batches. Returns False where there is no glibc.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, _MALLOC_KEEP)) and bool(
        mallopt(m_trim_threshold, _MALLOC_KEEP)
    )


def seed_item_rngs(seed: int) -> None:
    """Seed ``random``, NumPy's legacy global RNG and torch's CPU generator for one item.

    Economic and chunked workers call it before each item, so code that draws
    from the global RNGs (e.g. random transforms) gets the same draws whichever
    worker the item lands on. About 8 µs (``torch.manual_seed`` would take 100+).
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.default_generator.manual_seed(seed)


def apply_sharding(
    worker_pipe: DataPipe,
    root_indices: tuple[int, ...],
    total: int,
    index: int,
    group_size: int,
    outer: tuple[int, int] = (1, 0),
) -> None:
    """Tell the sharding roots of a worker's copy which shard is theirs.

    Worker ``index`` of ``total`` in outer shard ``outer = (R, r)`` (e.g. a
    rank) keeps shard ``index * R + r`` of ``R * total``: the process's share
    is shard ``r`` of ``R`` whatever its number of workers.
    """
    outer_total, outer_index = outer
    for root in _roots(worker_pipe, root_indices):
        root.sharding_settings(outer_total * total, index * outer_total + outer_index)
        if group_size != 1:
            root.set_shard_group_size(group_size)  # type: ignore[attr-defined]


def produce_epoch(
    pipe: IterDataPipe,
    put: Callable[[Any], None],
    *,
    epoch: int,
    worker_label: str,
    state: dict | None = None,
    full_stamp: bool = False,
    resume: tuple[tuple[int, ...], int] | None = None,
) -> bool:
    """Send ``(position, draws, item)`` for every output of ``pipe`` this epoch, then END.

    ``resume=(root_indices, position)`` starts the epoch at ``position``.
    With ``full_stamp`` the message is ``(stamp, item)`` instead, the stamp
    being ``(seed, epoch, position, draws)``. An exception from the pipeline is
    sent as a ``Failure`` instead. Returns False when the consumer is gone for
    good (its queue is closed or broken); True otherwise, also when the epoch
    was cancelled (``put`` raised :class:`EpochCancelled`).
    """
    restore_stamp((None, epoch, None))  # nothing inherited from a parent or a past epoch
    try:
        set_pipeline_epoch(pipe, epoch)
        reset_pipeline(pipe)
        if state is not None:
            from ..datapipes import load_pipeline_state_dict

            load_pipeline_state_dict(pipe, state)
        if resume is not None:  # fast-forward the sharding roots (only the prefix replays)
            root_indices, position = resume
            for root in _roots(pipe, root_indices):
                root.resume_at(position)
        reader = BlockingReader(pipe)
        while True:
            try:
                item = reader.next()
            except StopIteration:
                break
            put(
                (current_stamp(), item)
                if full_stamp
                else (current_position(), current_draws(), item)
            )
    except QueueError as error:
        return isinstance(error, EpochCancelled)
    except BaseException as error:  # noqa: BLE001 - every failure goes to the consumer
        try:
            put(capture_failure(error, worker_label))
        except QueueError as queue_error:
            return isinstance(queue_error, EpochCancelled)
        if not isinstance(error, Exception):
            raise
        return True
    try:
        put(END)
    except QueueError as error:
        return isinstance(error, EpochCancelled)
    return True


def _roots(pipe: DataPipe, indices: tuple[int, ...]) -> list[DataPipe]:
    nodes = traverse(pipe).nodes
    return [nodes[i] for i in indices]


class EpochCancelled(QueueError):
    """Raised by a worker's ``put`` when the main process abandoned the epoch."""
