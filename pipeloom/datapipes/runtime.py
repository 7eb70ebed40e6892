"""What code that runs pipelines needs from blocks; building a pipeline never does.

The seam between ``pipeloom.datapipes`` and the reading services, the compat
loader and ``pipeloom.testing``:

* the *item stamp* ``(seed, epoch, key, draws)`` of the item a thread works
  on, which a worker sends along with each output and the consumer restores,
  so ``item_rng()`` continues identically in every process (``stamp_item``
  starts one, for a block that stands in for a sharding point). The key is
  the item's position ``p``, or ``(p, j, ...)`` for output ``j`` of a block
  that makes several outputs of one input; ``key_position`` gives ``p``;
* which worker runs the current code (``set_worker_info``; the reading
  services set it, ``pipeloom.get_worker_info()`` and blocks read it);
* per-block framework state, changed through the block base's methods:
  restarting a part of a pipeline, forgetting ``lazy_init`` in a forked
  copy, reading the seed a block derives its randomness from.

Example:
    >>> from pipeloom.datapipes import IterableWrapper, seed_pipeline
    >>> from pipeloom.datapipes.runtime import block_seed, derive_seed
    >>> pipe = IterableWrapper(range(3))
    >>> seed_pipeline(pipe, 7)
    >>> block_seed(pipe) == derive_seed(7, 0)
    True
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterable

from ._base import DataPipe, IterDataPipe
from ._context import (
    NO_STAMP,
    ItemStamp,
    Key,
    current_draws,
    current_key,
    current_position,
    current_stamp,
    derive_seed,
    key_position,
    restore_stamp,
    set_output_queue,
    set_worker_info,
    stamp_item,
    worker_info,
)
from ._global_rngs import GlobalDrawCheck, global_rng_states, same_rng_states
from ._held import HeldShare, HoldsItems, load_held
from ._interrupts import cancel_interrupt, interrupt_waits
from ._pipeline import check_declared_inputs, upstream_blocks
from ._reader import waited_sources
from ._rest_of_epoch import RestOfEpoch
from ._runs import RUN_LOOP_CODES, Head, RunReader, running_stage

__all__ = [
    "NO_STAMP",
    "GlobalDrawCheck",
    "RUN_LOOP_CODES",
    "Head",
    "HeldShare",
    "HoldsItems",
    "RestOfEpoch",
    "RunReader",
    "ItemStamp",
    "Key",
    "block_seed",
    "cancel_interrupt",
    "check_declared_inputs",
    "current_draws",
    "current_key",
    "current_position",
    "current_stamp",
    "global_rng_states",
    "derive_seed",
    "end_iteration",
    "release_pipeline",
    "forget_lazy_init",
    "forget_shards",
    "note_shard",
    "interrupt_waits",
    "iteration_marks",
    "key_position",
    "load_held",
    "read_only_data",
    "restart_blocks",
    "restore_stamp",
    "same_rng_states",
    "running_stage",
    "set_output_queue",
    "set_worker_info",
    "stamp_item",
    "waited_sources",
    "worker_info",
]


def block_seed(block: DataPipe) -> int | None:
    """The seed ``block``'s randomness derives from (None when no pipeline seed was given)."""
    return block._block_seed()


def restart_blocks(blocks: Iterable[DataPipe]) -> None:
    """Restart each of ``blocks`` (given consumers first), as ``reset_pipeline`` does.

    For a caller that restarts the same part many times and walked it once.
    """
    for block in blocks:
        block._restart()


def iteration_marks(pipeline: DataPipe) -> list[tuple[IterDataPipe, int]]:
    """Each iterable block of ``pipeline`` with the restart it is in now, consumers first."""
    blocks = upstream_blocks(pipeline)
    return [(block, block._iteration()) for block in blocks if isinstance(block, IterDataPipe)]


def end_iteration(marks: list[tuple[IterDataPipe, int]]) -> None:
    """Restart each block still in the iteration ``marks`` recorded (consumers first).

    A service shut down mid-epoch (``shutdown()``, or its loader dropped) so
    gives back at once what its blocks hold: open streams, buffered items,
    helper threads; not at a next epoch's restart, nor when the garbage
    collector frees the pipeline (a block's generator keeps the block in a
    reference cycle). A block restarted since, by a newer epoch or by a newer
    loader over the same blocks, is left alone.
    """
    for block, iteration in marks:
        if block._iteration() == iteration:
            _restart_to_release(block)


def release_pipeline(pipeline: DataPipe) -> None:
    """Restart every block of ``pipeline`` (a worker's own copy) to give back what it holds."""
    for block in upstream_blocks(pipeline):
        _restart_to_release(block)


def _restart_to_release(block: DataPipe) -> None:
    try:
        block._restart()
    except Exception:  # noqa: BLE001 - a block that cannot start over (a one-shot source)
        pass  # says so when a next epoch asks it to, not when the loader lets go of it


def forget_lazy_init(pipeline: DataPipe) -> None:
    """Mark every block of a forked copy uninitialized: ``lazy_init`` runs again here.

    A pipeline that crossed into a worker by pickling is fresh already; one
    inherited through ``fork`` still carries what ``lazy_init`` did in the parent.
    """
    for block in upstream_blocks(pipeline):
        block._forget_lazy_init()


def note_shard(block: DataPipe, total: int, index: int) -> None:
    """Note that a reading service gave the sharding point ``block`` shard ``index`` of
    ``total`` (``sharding_settings`` is the block's own; this is the framework's record,
    which a snapshot reads and :func:`forget_shards` undoes)."""
    block._note_shard(total, index)


def forget_shards(pipeline: DataPipe) -> None:
    """Give each sharding point a reading service sharded (:func:`note_shard`) its whole
    stream back: a pipeline that an earlier loader ran as one rank's share, now run by a
    loader of its own, whose service shards it again where it must.

    A shard set by the user's own ``sharding_settings`` call is not noted, and stays.
    """
    for block in upstream_blocks(pipeline):
        if block._noted_shard() != (1, 0):
            block.sharding_settings(1, 0)
            if block.can_shard_in_groups():
                block.set_shard_group_size(1)
            block._note_shard(1, 0)


def read_only_data(pipeline: DataPipe) -> list[object]:
    """The data the blocks of ``pipeline`` only read, which copies in threads may share.

    A source over a built-in sequence (a ``list``, ``tuple``, ``range``, NumPy
    array, ``CompactStringList``) never changes it, so threads read one object
    concurrently instead of each deep-copying it, as torch's thread-based
    loaders do with the dataset. A block names such data with ``shared_data()``.
    A block's function (``fn``) that is a bound method of a torch map-style
    dataset (``map(dataset.__getitem__)``) counts too: the threads share the
    dataset, as torch's thread-based loaders do, instead of each deep-copying
    every row of it.
    """
    found: list[object] = []
    for block in upstream_blocks(pipeline):
        hook = getattr(block, "shared_data", None)
        if hook is not None:
            found.extend(hook())
        dataset = _dataset_of(getattr(block, "fn", None))
        if dataset is not None:
            found.append(dataset)
    return found


def _dataset_of(fn: object) -> object | None:
    """The torch ``Dataset`` whose bound method ``fn`` is, if it is one."""
    owner = getattr(fn, "__self__", None)
    if owner is None or not inspect.ismethod(fn):
        return None
    data = sys.modules.get("torch.utils.data")  # no torch imported: no torch dataset
    if data is None or not isinstance(owner, data.Dataset):
        return None
    return owner
