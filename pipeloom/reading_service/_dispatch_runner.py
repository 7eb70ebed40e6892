"""Epochs of the economic and chunked strategies (see ``_dispatch_plan``)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from typing import Any

from ..datapipes import (
    IterDataPipe,
    MapDataPipe,
    MapToIter,
    reset_pipeline,
    set_pipeline_epoch,
)
from ..datapipes.runtime import block_seed, derive_seed
from ..graph import Placement
from ..graph import copy as copy_pipeline
from ._dispatch_plan import DispatchPlan, plan_dispatch
from ._dispatch_pool import DispatchPool
from ._dispatch_workers import BatchFeed, TaskFeed
from ._dispatcher import Dispatcher
from ._in_process import drain
from ._merge import load_tail_state, tail_state
from ._pickling import dumps_pipeline
from ._plan import plan_workers
from ._separate import split_separate_processes
from ._start import worker_context

__all__ = ["DispatchRunner"]


class DispatchRunner:
    """What ``MultiProcessingReadingService`` runs for ``strategy="economic"|"chunked"``."""

    def __init__(
        self,
        *,
        strategy: str,
        num_workers: int,
        num_batch_workers: int,
        prefetch_factor: int,
        chunk_size: int | None,
        start_method: str | None,
        worker_init_fn: Callable[[int], None] | None,
        persistent_workers: bool,
        timeout: float | None,
    ) -> None:
        self.strategy = strategy
        self.num_workers = num_workers
        self.num_batch_workers = num_batch_workers
        self.prefetch_factor = prefetch_factor
        self.chunk_size = chunk_size
        self.start_method = start_method
        self.worker_init_fn = worker_init_fn
        self.persistent_workers = persistent_workers
        self.timeout = timeout
        self.outer_sharding: tuple[int, int] | None = None
        self._pool: DispatchPool | None = None
        self._gen = 0
        self._epoch_open = False

    def initialize(self, pipeline: IterDataPipe) -> None:
        plan = plan_dispatch(pipeline, self.strategy)
        # Under outer sharding (a rank's share) cut as the classic plan does, so a
        # rank gets the same items whatever the strategy.
        self._outer_group = plan_workers(pipeline).group_size
        batch_size = plan.batch_size
        if self.strategy == "chunked":
            if self.chunk_size is None:
                self.chunk_size = max(1, math.ceil(batch_size / self.num_workers))
            elif self.chunk_size > batch_size:
                raise ValueError(
                    f"chunk_size must be at most the batch size ({batch_size}), got "
                    f"{self.chunk_size}; a chunk is a part of one batch. Use chunk_size <= "
                    f"{batch_size}, or leave it None to spread each batch over the workers"
                )
            unit_size = self.chunk_size
            max_units = max(1, math.ceil(self.prefetch_factor * batch_size / unit_size))
        else:
            unit_size, max_units = batch_size, self.prefetch_factor
        self._plan = plan
        self._dispatcher = Dispatcher(
            unit_size=unit_size, max_units=max_units, per_item_tasks=self.strategy == "economic"
        )
        main = (
            self._dispatcher
            if plan.exit is pipeline
            else copy_pipeline(pipeline, replace={plan.exit: self._dispatcher})
        )
        self._main, self._separate = split_separate_processes(
            main,
            start_method=self.start_method,
            prefetch=self.prefetch_factor,
            forbidden=self._dispatcher,
        )
        self._max_units = max_units
        self._max_tasks = max_units * (unit_size if self.strategy == "economic" else 1)
        forked = worker_context(self.start_method).get_start_method() == "fork"
        item_chain, batch_chain = _worker_chains(plan)
        self._item_payload = item_chain if forked else dumps_pipeline(item_chain)
        self._batch_payload: Any = None
        if batch_chain is not None:
            self._batch_payload = batch_chain if forked else dumps_pipeline(batch_chain)

    def start_epoch(self, epoch: int, state: dict[str, Any] | None) -> Iterator[Any]:
        self._finish_epoch()
        set_pipeline_epoch(self._main, epoch)
        reset_pipeline(self._main)
        if state is not None:
            load_tail_state(self._main, state)
        source = self._epoch_source(epoch)
        position, _ = self._dispatcher.resume_from
        if state is not None and position:
            source.resume_at(position)
        root = self._plan.root
        root_seed = block_seed(root)
        stamp_seed = None if root_seed is None else derive_seed(root_seed, epoch)
        if self._pool is None:
            self._pool = self._start_pool()
        self._gen += 1
        self._pool.start_epoch(self._gen, epoch, stamp_seed)
        self._dispatcher.attach(source, self._pool, gen=self._gen, seed=stamp_seed, epoch=epoch)
        self._epoch_open = True
        for reader in self._separate:
            reader.start(epoch)
        return drain(self._main, on_close=self._on_epoch_closed, timeout=self.timeout)

    def _epoch_source(self, epoch: int) -> IterDataPipe:
        """The sharding root (and its upstream) as the main process reads it this epoch."""
        root = self._plan.root
        if self.outer_sharding is not None and self.outer_sharding != (1, 0):
            root.sharding_settings(*self.outer_sharding)
            if self._outer_group != 1:
                root.set_shard_group_size(self._outer_group)  # type: ignore[attr-defined]
        set_pipeline_epoch(root, epoch)
        reset_pipeline(root)
        if isinstance(root, MapToIter):  # hand out indices; workers read the items
            indices = copy.copy(root)
            indices.source = _IndexSpace(root.source)
            indices.reset()
            return indices
        return root

    def _start_pool(self) -> DispatchPool:
        plan = self._plan
        return DispatchPool(
            worker_context(self.start_method),
            item_payload=self._item_payload,
            batch_payload=self._batch_payload,
            num_item_workers=self.num_workers,
            num_batch_workers=self.num_batch_workers,
            max_tasks=self._max_tasks,
            max_results=self._max_units,
            seed=block_seed(plan.item_exit) or 0,
            worker_init_fn=self.worker_init_fn,
        )

    def state_dict(self) -> dict[str, Any]:
        return tail_state(self._main)

    def placement(self) -> Placement:
        batch_label = f"batch workers x{self.num_batch_workers}"
        return self._plan.placement(f"item worker processes x{self.num_workers}", batch_label)

    def shutdown(self) -> None:
        for reader in getattr(self, "_separate", ()):
            reader.stop()
        self._stop_pool()
        self._epoch_open = False

    def _on_epoch_closed(self, finished: bool) -> None:
        self._finish_epoch()

    def _finish_epoch(self) -> None:
        """End the open epoch; persistent workers drop its leftovers by generation."""
        if not self._epoch_open:
            return
        self._epoch_open = False
        if not self.persistent_workers:
            self._stop_pool()

    def _stop_pool(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool = None


def _worker_chains(plan: DispatchPlan) -> tuple[IterDataPipe, IterDataPipe | None]:
    """Copies of the item workers' and batch workers' parts, fed by a feed block."""
    root = plan.root
    feed = TaskFeed(root.source if isinstance(root, MapToIter) else None)
    item_chain = copy_pipeline(plan.item_exit, replace={root: feed})
    if plan.batch_exit is None:
        return item_chain, None
    batch_chain = copy_pipeline(plan.batch_exit, replace={plan.item_exit: BatchFeed()})
    return item_chain, batch_chain


class _IndexSpace(MapDataPipe):
    """``index -> index`` over the indices of a map-style block (its length only)."""

    inputs = ()  # the map-style block is read only for its length, in the main process

    def __init__(self, of: MapDataPipe) -> None:
        self._of = [of]  # not an input: only its length is read, in the main process

    def async_get(self, index: int) -> Any:
        return index

    def __len__(self) -> int:
        return len(self._of[0])
