"""The epochs of the economic and chunked strategies (``economic.py``, ``chunked.py``).

The main process runs the sharding point and everything upstream of it (on
the pipeline itself), and a copy of the rest with a :class:`Dispatcher` in
place of the workers' exit. Each epoch the dispatcher reads the sharding
point and hands out the work; the worker processes live in a
:class:`DispatchPool`, started at the first epoch.

A map-style source read through ``MapToIter`` is not read in the main
process: only its index crosses to the worker, which reads the item itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

from ...._shutdown import Steps
from ....datapipes import IterDataPipe, MapDataPipe, MapToIter, reset_pipeline, set_pipeline_epoch
from ....datapipes.runtime import block_seed, derive_seed, read_only_data
from ....errors import WorkerError
from ....graph import Plan, copy
from ...planning.cut import cut_for_dispatch
from ...planning.sharding import keep_shard
from ...workers.process import Payload, worker_context
from ...workers.rngs import workers_seed
from ..main_part import MainPart
from ..runner import Runner, drain
from .chain import BatchFeed, TaskFeed
from .dispatcher import Dispatcher
from .lost_work import naming_lost_work
from .pool import DispatchPool

__all__ = ["DispatchRunner"]


class DispatchRunner(Runner):
    """What economic and chunked share; a subclass says how work is handed out.

    Args:
        pipeline, plan: the pipeline and its economic or chunked plan.
        start_method, worker_init_fn, persistent_workers, timeout, prefetch:
            as for ``MultiProcessingReadingService``.
    """

    #: Each item is its own task for the least loaded item worker (economic);
    #: otherwise a whole unit (a chunk) is one task.
    per_item_tasks: ClassVar[bool]

    def __init__(
        self,
        pipeline: IterDataPipe,
        plan: Plan,
        *,
        start_method: str | None,
        worker_init_fn: Callable[[int], None] | None,
        persistent_workers: bool,
        timeout: float | None,
        prefetch: int,
    ) -> None:
        super().__init__(pipeline, plan)
        assert plan.unit is not None and isinstance(plan.sharding_point, IterDataPipe)
        _, unit_size, max_units = plan.unit
        self.point = plan.sharding_point
        self.worker_init_fn = worker_init_fn
        self.persistent_workers = persistent_workers
        self.timeout = timeout
        self._context = worker_context(start_method)
        item_part = plan.part("item workers")
        batch_parts = [p for p in plan.parts if p.role == "batch workers"]
        exit = batch_parts[0].exit if batch_parts else item_part.exit
        assert item_part.exit is not None and exit is not None
        self.num_item_workers = item_part.copies
        self.num_batch_workers = batch_parts[0].copies if batch_parts else 0
        if plan.outer != (1, 0):  # this process's share (a rank's), cut as classic would
            keep_shard(self.point, group_size=plan.group_size, outer=plan.outer)
        # Economic without batch workers: each task is a whole batch, as a chunk is.
        per_item_tasks = self.per_item_tasks and bool(batch_parts)
        cut = cut_for_dispatch(pipeline, plan.strategy)
        # Item workers build whole batches (economic without batch workers, chunked whose
        # per-item blocks are one to one): the batch part runs as a batch worker's would,
        # after the items (the same global-RNG seeding per batch).
        whole_batches = not batch_parts and cut.batch_exit is not None
        first_chunk = plan.first_unit_chunk  # chunked: the first batch in chunks, built here
        # The copies refer to the data the blocks only read (a dataset's rows, a list of
        # paths) instead of deep-copying it: the workers get it by fork or by pickle
        # anyway, and a deep copy of a large dataset cost the first epoch hundreds of ms.
        shared = read_only_data(pipeline)
        local_chain: IterDataPipe | None = None
        if first_chunk is not None:
            chain = copy(exit, replace={cut.item_exit: BatchFeed()}, share=shared)
            assert isinstance(chain, IterDataPipe)  # the exit of the item part is iterable
            local_chain = chain
        self.dispatcher = Dispatcher(
            unit_size=unit_size,
            max_units=max_units,
            per_item_tasks=per_item_tasks,
            units_are_batches=self.per_item_tasks or (whole_batches and not cut.relayed),
            first_unit_chunk=first_chunk,
            batch_chain=local_chain,
            relayed=cut.relayed,
            batches_ahead=prefetch if cut.relayed else None,
        )
        self.main = MainPart(
            pipeline, plan, self.dispatcher, exit, start_method=start_method, prefetch=prefetch
        )
        first_chunks = 0 if first_chunk is None else -(-unit_size // first_chunk)
        self._max_units = max_units + first_chunks
        self._max_tasks = max_units * (unit_size if per_item_tasks else 1) + first_chunks
        self._relayed = cut.relayed
        if cut.relayed:
            self._max_tasks += 1  # the epoch's final chunk
        source = self.point.source if isinstance(self.point, MapToIter) else None
        self._batch_payload: Payload | None = None
        self._own_batch_payload: Payload | None = None  # item workers building whole batches
        item_exit = item_part.exit
        if batch_parts:
            batch_chain = copy(exit, replace={item_part.exit: BatchFeed()}, share=shared)
            self._batch_payload = Payload(batch_chain, self._context, start_timeout=timeout)
        elif whole_batches:
            item_exit = cut.item_exit
            batch_chain = copy(exit, replace={item_exit: BatchFeed()}, share=shared)
            self._own_batch_payload = Payload(batch_chain, self._context, start_timeout=timeout)
        item_chain = copy(item_exit, replace={self.point: TaskFeed(source)}, share=shared)
        self._item_payload = Payload(item_chain, self._context, start_timeout=timeout)
        self._pool: DispatchPool | None = None
        self._gen = 0
        self._epoch_open = False

    def start_epoch(self, epoch: int, state: dict[str, Any] | None) -> Iterator[Any]:
        self._finish_epoch()
        self.main.start_epoch(epoch, state)
        source = self._epoch_source(epoch)
        position, _, _ = self.dispatcher.resume_from
        if state is not None and position:
            source.resume_at(position)
        point_seed = block_seed(self.point)
        stamp_seed = None if point_seed is None else derive_seed(point_seed, epoch)
        if self._pool is None:
            self._pool = self._start_pool()
        self._gen += 1
        try:
            self._pool.start_epoch(self._gen, epoch, stamp_seed)
        except WorkerError:  # a persistent worker died between epochs: said once,
            self._stop_pool()  # the next epoch starts new workers
            raise
        self.dispatcher.attach(source, self._pool, gen=self._gen, seed=stamp_seed, epoch=epoch)
        self._epoch_open = True
        self.main.start_separate_processes(epoch)
        items = drain(self.main.pipeline, on_close=self._on_epoch_closed, timeout=self.timeout)
        units = "batches" if self.dispatcher.units_are_batches else "chunks"
        return naming_lost_work(items, self.dispatcher, units)

    def _epoch_source(self, epoch: int) -> IterDataPipe:
        """The sharding point (and its upstream) as the main process reads it this epoch."""
        point = self.point
        set_pipeline_epoch(point, epoch)
        reset_pipeline(point)
        if isinstance(point, MapToIter):  # hand out indices; workers read the items
            indices = copy(point, replace={point.source: _IndexSpace(point.source)})
            indices.reset()
            return indices
        return point

    def _start_pool(self) -> DispatchPool:
        return DispatchPool(
            self._context,
            item_payload=self._item_payload,
            batch_payload=self._batch_payload,
            own_batch_payload=self._own_batch_payload,
            num_item_workers=self.num_item_workers,
            num_batch_workers=self.num_batch_workers,
            max_tasks=self._max_tasks,
            max_results=self._max_units,
            seed=workers_seed(block_seed(self.plan.part("item workers").exit), self.plan.outer),  # type: ignore[arg-type]
            worker_init_fn=self.worker_init_fn,
            relay=self._relayed,
        )

    def state_dict(self) -> dict[str, Any]:
        return self.main.state_dict()

    def shutdown(self) -> None:
        self._epoch_open = False
        with Steps() as steps:
            steps.run(self.main.stop)
            steps.run(self._stop_pool)
            # their templates (spawn), kept between epochs until now
            for payload in (self._item_payload, self._batch_payload, self._own_batch_payload):
                if payload is not None:
                    steps.run(payload.close)

    def queues(self) -> Sequence[tuple[str, Any]]:
        pool = self._pool
        return [*([] if pool is None else pool.queues()), *self.main.queues()]

    def _on_epoch_closed(self, finished: bool) -> None:
        self._finish_epoch()

    def _finish_epoch(self) -> None:
        """End the open epoch; persistent workers drop its leftovers by generation."""
        if not self._epoch_open:
            return
        self._epoch_open = False
        if not self.persistent_workers or (self._pool is not None and self._pool.lost_worker()):
            self._stop_pool()  # a dead worker was reported: the next epoch starts new ones

    def _stop_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()  # runs to its end even if interrupted (finalize_here)


class _IndexSpace(MapDataPipe):
    """``index -> index`` over the indices of a map-style block (its length only)."""

    inputs = ()  # the map-style block is read only for its length, in the main process

    def __init__(self, of: MapDataPipe) -> None:
        self._of = [of]

    def async_get(self, index: int) -> Any:
        return index

    def __len__(self) -> int:
        return len(self._of[0])
