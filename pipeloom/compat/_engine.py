"""What the compat loader runs: a pipeline and a reading service built from torch's arguments."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import torch.utils.data

from ..datapipes import IterDataPipe, default_collate
from ..reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ReadingService,
    ThreadReadingService,
)
from ._args import start_method_of
from ._fetch import Fetch, GetItem, IterableDatasetSource
from ._plan import PlanBoard
from ._plan_source import PlanSource

__all__ = [
    "build_map_pipeline",
    "build_pipeline",
    "build_service",
    "copies_dataset_once",
    "why_not_per_item",
]


def build_map_pipeline(
    board: PlanBoard,
    dataset: Any,
    collate_fn: Callable[[Any], Any],
    *,
    auto_collation: bool,
    per_item_batch: tuple[int, bool] | None = None,
) -> IterDataPipe:
    """The pipeline for a map-style dataset: the epoch's sampler output, fetched.

    By default each sampler output (an index list, or one index without
    auto-collation) becomes one batch through :class:`Fetch` -- torch's
    fetcher, ``__getitems__`` included. With ``per_item_batch=(batch_size,
    drop_last)`` the indices are fetched one by one and batched after, so a
    strategy with item workers and batch workers can split the work.

    Example:
        >>> from pipeloom.compat._plan import EpochPlan, PlanEntries
        >>> board = PlanBoard()
        >>> board.publish(EpochPlan(PlanEntries.from_outputs([[2, 0], [1]]), 0))
        >>> list(build_map_pipeline(board, "abc", list, auto_collation=True))
        [['c', 'a'], ['b']]
    """
    if per_item_batch is None:
        fetch = Fetch(dataset, collate_fn, auto_collation)
        return PlanSource(board, fetch=fetch).map(fetch)
    batch_size, drop_last = per_item_batch
    return (
        PlanSource(board, flatten=True)
        .map(GetItem(dataset))
        .batch(batch_size, drop_last=drop_last)
        .collate(collate_fn)
    )


def build_pipeline(loader: Any) -> IterDataPipe:
    """The pipeline that reads ``loader``'s dataset (see ``docs/compat.md``)."""
    pipeline: IterDataPipe
    collate_fn = loader.collate_fn
    if collate_fn is torch.utils.data.default_collate:
        # ours, as for collate_fn=None: torch's own, called in a worker process, stacks
        # samples of mixed dtypes into the first one's (uint8 then -3 gives 253), so each
        # strategy would give another batch; ours gives torch's num_workers=0 batch
        collate_fn = default_collate
    if loader._iterable:
        pipeline = IterableDatasetSource(
            loader.dataset,
            batch_size=loader.batch_size,
            collate_fn=collate_fn,
            drop_last=loader.drop_last,
            board=loader._board,
        )
    else:
        per_item = (
            loader.strategy in ("economic", "chunked")
            and loader._own_batch_sampler
            and not getattr(loader.dataset, "__getitems__", None)
        )
        assert loader.batch_size is not None or not per_item
        pipeline = build_map_pipeline(
            loader._board,
            loader.dataset,
            collate_fn,
            auto_collation=loader._auto_collation,
            per_item_batch=(loader.batch_size, loader.drop_last) if per_item else None,  # type: ignore[arg-type]
        )
    if loader.pin_memory:
        pipeline = pipeline.pin_memory()
    return pipeline


def build_service(loader: Any) -> ReadingService:
    """The reading service ``loader``'s worker arguments ask for."""
    if loader.num_workers == 0:
        return InProcessReadingService()
    assert loader.prefetch_factor is not None
    # torch takes any integer (np.int64 from a config): the services take Python ints
    num_workers, prefetch_factor = int(loader.num_workers), int(loader.prefetch_factor)
    if loader.worker_type == "thread":
        return ThreadReadingService(
            num_workers,
            prefetch_factor=prefetch_factor,
            in_order=bool(loader.in_order),  # torch takes any truthy value
        )
    return MultiProcessingReadingService(
        num_workers,
        prefetch_factor=prefetch_factor,
        start_method=start_method_of(loader.multiprocessing_context),
        worker_init_fn=loader._setup,
        persistent_workers=bool(loader.persistent_workers),  # torch takes any truthy value
        timeout=loader.timeout or None,
        in_order=bool(loader.in_order),
        # classic workers' global RNG streams run on across epochs, as torch's do
        reseed_global_rngs=loader.strategy != "classic",
        **loader._strategy_kwargs,
    )


def copies_dataset_once(loader: Any) -> bool:
    """True when a running engine's new workers would get a stale copy of the dataset.

    Non-persistent worker processes restart each epoch; under ``fork`` they
    inherit the dataset as it is now, but otherwise the engine pickled it
    once, when it started (spawn: into a template its workers fork from).
    """
    if loader.num_workers == 0 or loader.worker_type != "process" or loader.persistent_workers:
        return False
    method = start_method_of(loader.multiprocessing_context)
    return multiprocessing.get_context(method).get_start_method() != "fork"


def why_not_per_item(dataset: Any, own_batch_sampler: bool, in_order: bool) -> str:
    """Why a map-style dataset cannot be fetched item by item ('' when it can)."""
    if not own_batch_sampler:
        return "batch_sampler (or batch_size=None) fixes each batch's indices in the sampler"
    if getattr(dataset, "__getitems__", None) is not None:
        return "the dataset fetches whole batches with __getitems__"
    if not in_order:
        return "in_order=False asks for arrival order, which only 'classic' offers"
    return ""
