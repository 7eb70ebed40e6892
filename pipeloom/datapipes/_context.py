"""Seeds and the per-item random context.

Every random decision in pipeloom is drawn from a seed derived from
``(loader seed, block, epoch)`` or, for work on one item, from
``(seed, epoch, item position)``. The *position* of an item is stamped by the
block where items originate or are sharded (a source, ``sharding_filter``),
so it does not depend on which worker processes the item.

User functions get per-item randomness with :func:`item_rng` / :func:`item_seed`:

Example:
    >>> from pipeloom.datapipes import IterableWrapper, item_rng, seed_pipeline
    >>> dp = IterableWrapper(range(3)).map(lambda x: x + item_rng().random())
    >>> seed_pipeline(dp, 0); a = list(dp)
    >>> seed_pipeline(dp, 0); b = list(dp)
    >>> a == b
    True
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "NO_STAMP",
    "ItemStamp",
    "current_draws",
    "current_position",
    "current_stamp",
    "derive_seed",
    "item_rng",
    "item_seed",
    "restore_stamp",
    "stamp_item",
]

_MASK64 = (1 << 64) - 1


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def derive_seed(*parts: int) -> int:
    """Mix integers into one well-distributed 63-bit seed (fast, deterministic).

    >>> derive_seed(1, 2) == derive_seed(1, 2) != derive_seed(2, 1)
    True
    """
    value = 0x5EED
    for part in parts:
        value = _splitmix64(value ^ (part & _MASK64))
    return value >> 1


ItemStamp = tuple[int | None, int, int | None, int]
"""``(seed, epoch, position, draws)``: which item a thread works on, and its draws so far."""

NO_STAMP: ItemStamp = (None, 0, None, 0)


class _ItemState(threading.local):
    """Per-thread stamp of the item being processed: ``(seed, epoch, position, draws)``.

    One immutable tuple in one attribute: the cheapest thing to set per item.
    """

    stamp: ItemStamp = NO_STAMP
    watchers: tuple[Callable[[int | None, int], None], ...] = ()


_ITEM = _ItemState()


def stamp_item(seed: int | None, epoch: int, position: int) -> None:
    """Record that the current thread now works on item ``position``.

    Called by blocks where items originate (sources, sharding points).
    """
    item = _ITEM
    item.stamp = (seed, epoch, position, 0)
    if item.watchers:
        for watcher in item.watchers:
            watcher(seed, position)


def watch_stamps(watcher: Callable[[int | None, int], None]) -> tuple:
    """Call ``watcher(seed, position)`` at every :func:`stamp_item` in this thread.

    Returns the previous watchers; pass them to :func:`unwatch_stamps` to stop.
    A snapshot uses it to see every position its sharding point stamps, also
    the ones a ``filter`` drops before they reach it.
    """
    previous = _ITEM.watchers
    _ITEM.watchers = (*previous, watcher)
    return previous


def unwatch_stamps(previous: tuple) -> None:
    """Restore the watchers :func:`watch_stamps` returned."""
    _ITEM.watchers = previous


def current_stamp() -> ItemStamp:
    """The (seed, epoch, position, draws) stamp of the current thread."""
    return _ITEM.stamp


def restore_stamp(stamp: tuple) -> None:
    """Re-install a stamp captured with :func:`current_stamp` (e.g. in another thread).

    A 3-tuple ``(seed, epoch, position)`` restores with no draws made yet.
    """
    _ITEM.stamp = tuple(stamp) if len(stamp) == 4 else (stamp[0], stamp[1], stamp[2], 0)


def current_draws() -> int:
    """How many item seeds were drawn for the current item so far."""
    return _ITEM.stamp[3]


def current_position() -> int | None:
    """Position (within its epoch) of the item the current thread works on."""
    return _ITEM.stamp[2]


def item_seed() -> int:
    """A seed for random work on the current item.

    It depends only on the pipeline seed, the epoch, the item's position and
    how many seeds were already drawn for this item, so augmentations are the
    same whichever worker, thread or reading service processes the item.

    Raises:
        RuntimeError: when called outside a running pipeline.
    """
    seed, epoch, position, draws = _ITEM.stamp
    if position is None:
        raise RuntimeError(
            "item_seed()/item_rng() was called outside a pipeline: no item is being "
            "processed in this thread. Call it from a function passed to a block "
            "such as .map(fn) while the pipeline is iterated."
        )
    _ITEM.stamp = (seed, epoch, position, draws + 1)
    return derive_seed(seed or 0, epoch, position, draws)


def item_rng() -> np.random.Generator:
    """A NumPy generator for random work on the current item (see :func:`item_seed`).

    For torch: ``torch.Generator().manual_seed(item_seed())``.
    """
    return np.random.Generator(np.random.PCG64(item_seed()))


class _WorkerSlot(threading.local):
    info: Any = None


_THREAD_WORKER = _WorkerSlot()
_PROCESS_WORKER: list[Any] = [None]


def worker_info() -> Any:
    """The ``WorkerInfo`` of the worker running this code, or None outside workers.

    Reading services set it (``pipeloom.get_worker_info()`` returns it); blocks
    read it here, below the reading services, e.g. to name the shard a worker writes.
    """
    return _THREAD_WORKER.info or _PROCESS_WORKER[0]


def set_worker_info(info: Any, *, thread: bool) -> None:
    """Declare the calling thread (``thread=True``) or the whole process a worker."""
    if thread:
        _THREAD_WORKER.info = info
    else:
        _PROCESS_WORKER[0] = info
