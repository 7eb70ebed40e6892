"""Seeds and the per-item random context.

Every random decision in pipeloom is drawn from a seed derived from
``(loader seed, block, epoch)`` or, for work on one item, from
``(seed, epoch, item key)``. An item's *key* is its *position*, stamped by the
block where items originate or are sharded (a source, ``sharding_filter``),
so it does not depend on which worker processes the item. A block that makes
several outputs of one input (``flatmap``, tar members, ``unbatch``) gives
output ``j`` the key ``(position, j)`` (nested: ``(position, j, k)``), whose
draws start afresh; a block that groups several inputs into one output
(``batch``, ``webdataset``) stamps it with its first input's stamp.

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

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "NO_STAMP",
    "ItemStamp",
    "current_draws",
    "current_key",
    "current_position",
    "current_stamp",
    "derive_seed",
    "empty_output",
    "item_rng",
    "item_seed",
    "item_stamp",
    "key_position",
    "output_stamp",
    "restore_stamp",
    "set_item_stamp",
    "set_output_queue",
    "stamp_item",
    "stamp_output",
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


Key = int | tuple[int, ...]
"""An item's key: its position ``p``, or ``(p, j, ...)`` for output ``j`` of the item at ``p``."""

ItemStamp = tuple[int | None, int, Key | None, int]
"""``(seed, epoch, key, draws)``: which item a thread works on, and its draws so far.

The key sits where a plain stamp has its position, so a plain stamp is
``(seed, epoch, position, draws)``: the cheapest thing to set per item.
"""

NO_STAMP: ItemStamp = (None, 0, None, 0)


class _ItemState(threading.local):
    """Per-thread stamp of the item being processed: ``(seed, epoch, position, draws)``.

    One immutable tuple in one attribute: the cheapest thing to set per item.
    """

    stamp: ItemStamp = NO_STAMP
    watchers: tuple[Callable[[int | None, int], None], ...] = ()
    positioned: ItemStamp | None = None  # the stamp a block's stamp_position last set
    drawn: int = 0  # item seeds drawn in this thread, ever (a stamp's count restarts)


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
    if stamp.__class__ is tuple and len(stamp) == 4:
        _ITEM.stamp = stamp  # type: ignore[assignment]
    else:
        _ITEM.stamp = (stamp[0], stamp[1], stamp[2], stamp[3] if len(stamp) == 4 else 0)


def current_draws() -> int:
    """How many item seeds were drawn for the current item so far."""
    return _ITEM.stamp[3]


def thread_draws() -> int:
    """How many item seeds this thread drew so far: a block that restamps the items it
    passes on (a sharding point, a source) starts their count afresh, so a block
    downstream sees the draws made upstream only as a change of this number."""
    return _ITEM.drawn


def add_thread_draws(count: int) -> None:
    """Count ``count`` item seeds drawn for this thread's items in another thread (a pool's)."""
    _ITEM.drawn += count


def key_position(key: Key | None) -> int | None:
    """The source position of an item ``key`` (``p`` of ``p`` or ``(p, j, ...)``).

    >>> key_position(7), key_position((7, 2)), key_position(None)
    (7, 7, None)
    """
    return key if key.__class__ is not tuple else key[0]  # type: ignore[index,return-value]


def current_position() -> int | None:
    """Position (within its epoch) of the source item the current thread works on.

    For output ``j`` of the item at position ``p`` (see :func:`current_key`) it is ``p``.
    """
    key = _ITEM.stamp[2]
    return key if key.__class__ is not tuple else key[0]  # type: ignore[index,return-value]


def current_key() -> Key | None:
    """The key of the item the current thread works on: ``p``, or ``(p, j, ...)``.

    Output ``j`` of the item at key ``k`` (``flatmap``, tar members, ``unbatch``)
    has the key ``(*k, j)``; ``item_rng()`` derives from the key.
    """
    return _ITEM.stamp[2]


def output_stamp(stamp: ItemStamp, index: int) -> ItemStamp:
    """The stamp of output ``index`` of the item stamped ``stamp``: key ``(*key, index)``, no draws.

    >>> output_stamp((1, 0, 5, 3), 2), output_stamp((1, 0, (5, 2), 0), 0)
    ((1, 0, (5, 2), 0), (1, 0, (5, 2, 0), 0))
    """
    seed, epoch, key, _ = stamp
    if key is None:
        return (seed, epoch, None, 0)
    if key.__class__ is tuple:
        return (seed, epoch, (*key, index), 0)  # type: ignore[misc]
    return (seed, epoch, (key, index), 0)  # type: ignore[return-value]


def stamp_output(stamp: ItemStamp, index: int) -> None:
    """Mark the current item as output ``index`` of the item stamped ``stamp``."""
    seed, epoch, key, _ = stamp
    if key is None:
        _ITEM.stamp = (seed, epoch, None, 0)
    elif key.__class__ is tuple:
        _ITEM.stamp = (seed, epoch, (*key, index), 0)  # type: ignore[misc]
    else:
        _ITEM.stamp = (seed, epoch, (key, index), 0)  # type: ignore[assignment]


def item_stamp() -> ItemStamp:
    """The stamp of the item the current thread works on (plain, picklable: keep it in a state).

    For a custom block that keeps items and hands them out later (or makes
    several outputs of one input): take the stamp right after pulling an
    input, and give it back with :func:`set_item_stamp` before returning what
    came from that input.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper, seed_pipeline
        >>> pipe = IterableWrapper("ab").map(lambda x: (x, item_stamp()))
        >>> seed_pipeline(pipe, 0)
        >>> [stamp[2] for _, stamp in pipe]  # the key: here the position
        [0, 1]
    """
    return _ITEM.stamp


def set_item_stamp(stamp: ItemStamp, output: int | None = None) -> None:
    """Make ``stamp`` (from :func:`item_stamp`) current again; ``output=j``: its ``j``-th output.

    The ``j``-th output of an input gets its own key (the input's key and
    ``j``), so its ``item_rng()`` draws differ from the input's and from every
    other output's, identically under every reading service.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper, IterDataPipe, seed_pipeline
        >>> class Twice(IterDataPipe):  # two outputs per input, each with its own key
        ...     inputs = ("source",)
        ...     def __init__(self, source):
        ...         self.source, self._pending = source, []
        ...     def reset(self):
        ...         self._pending = []
        ...     def async_next(self):
        ...         if not self._pending:
        ...             item = self.source.async_next()
        ...             stamp = item_stamp()
        ...             self._pending = [(item, stamp, 0), (item, stamp, 1)]
        ...         item, stamp, j = self._pending.pop(0)
        ...         set_item_stamp(stamp, output=j)
        ...         return item
        >>> pipe = Twice(IterableWrapper("ab")).map(lambda x: (x, current_key()))
        >>> seed_pipeline(pipe, 0)
        >>> list(pipe)
        [('a', (0, 0)), ('a', (0, 1)), ('b', (1, 0)), ('b', (1, 1))]
    """
    if output is None:
        restore_stamp(stamp)
    else:
        stamp_output(tuple(stamp), output)  # type: ignore[arg-type]


def item_seed() -> int:
    """A seed for random work on the current item.

    It depends only on the pipeline seed, the epoch, the item's key (its
    position, or ``(position, j, ...)`` for the ``j``-th output of a block that
    makes several outputs of one input) and how many seeds were already drawn
    for this item, so augmentations are the same whichever worker, thread or
    reading service processes the item.

    Raises:
        RuntimeError: when called outside a running pipeline.
    """
    seed, epoch, key, draws = _ITEM.stamp
    if key is None:
        raise RuntimeError(
            "item_seed()/item_rng() was called outside a pipeline: no item is being "
            "processed in this thread. Call it from a function passed to a block "
            "such as .map(fn) while the pipeline is iterated."
        )
    item = _ITEM
    item.stamp = (seed, epoch, key, draws + 1)
    item.drawn += 1
    if key.__class__ is tuple:
        return derive_seed(seed or 0, epoch, *key, draws)  # type: ignore[misc]
    return derive_seed(seed or 0, epoch, key, draws)  # type: ignore[arg-type]


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


_OUTPUT_QUEUE: list[Any] = [None, 0]  # the queue this process's outputs leave by, its pid


def set_output_queue(queue: Any) -> None:
    """Declare the queue (a producer end) by which this process's outputs leave it.

    Reading services call it in worker processes; :func:`empty_output` then
    allocates in that queue's shared memory. A process forked from this one
    does not inherit it. ``None`` forgets it.
    """
    _OUTPUT_QUEUE[:] = [queue, os.getpid()]


class _WarmSlot(threading.local):
    pool: Any = None


_WARM = _WarmSlot()


def collating_into(pool: Any) -> Any:
    """Make ``pool`` (a ``WarmBuffers``) where :func:`empty_output` allocates in this
    thread, outside worker processes; returns the previous one, to restore."""
    previous = _WARM.pool
    _WARM.pool = pool
    return previous


def collates_into_buffers() -> bool:
    """True where :func:`empty_output` gives more than ``torch.empty``."""
    return _WARM.pool is not None or sends_outputs()


def sends_outputs() -> bool:
    """True in a process whose outputs leave by a queue (:func:`set_output_queue`)."""
    queue, pid = _OUTPUT_QUEUE
    return queue is not None and pid == os.getpid()


def empty_output(shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Like ``torch.empty``, for a tensor this worker will send on (a collated batch).

    In a worker process, the tensor lies in the shared memory of the queue
    that carries the worker's outputs, so sending it copies nothing (torch's
    workers do the same when they collate). Elsewhere, inside ``collate``,
    big tensors reuse the memory of batches already dropped, so stacking does
    not fault in fresh pages; otherwise it is ``torch.empty``.
    ``default_collate`` uses it; use it in your own collate function to the
    same end. Fill it before the batch leaves the collate function.

    Example:
        >>> rows = [torch.ones(3), torch.zeros(3)]
        >>> torch.stack(rows, out=empty_output((2, 3), rows[0].dtype))
        tensor([[1., 1., 1.],
                [0., 0., 0.]])
    """
    if sends_outputs():
        return _OUTPUT_QUEUE[0].empty_tensor(tuple(shape), dtype)
    if _WARM.pool is not None:
        return _WARM.pool.empty(shape, dtype)
    return torch.empty(tuple(shape), dtype=dtype)
