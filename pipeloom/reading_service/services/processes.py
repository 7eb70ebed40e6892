"""Worker processes: the classic, economic or chunked strategy, chosen once."""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import os
import warnings
from collections.abc import Callable
from typing import Any, cast

from ..._validate import (
    check_bool,
    check_callable,
    check_choice,
    check_int,
    check_seconds,
)
from ...datapipes import IterDataPipe
from ...datapipes.runtime import block_seed
from ...graph import Plan
from ..planning.cut import PlanError
from ..planning.planner import Settings, make_plan
from ..strategies.chunked import ChunkedRunner
from ..strategies.classic.process_pool import ProcessPool
from ..strategies.classic.runner import ClassicRunner
from ..strategies.classic.warm_start import WarmStartRunner
from ..strategies.economic import EconomicRunner
from ..strategies.in_process import InProcessRunner
from ..strategies.runner import Runner
from ..workers.process import worker_context
from ..workers.rngs import workers_seed
from ..workers.start_server import ServedContext, start_server
from .base import PlannedService
from .threads import ThreadReadingService

__all__ = ["STRATEGIES", "MultiProcessingReadingService", "default_batch_workers"]

STRATEGIES = ("classic", "economic", "chunked")


class MultiProcessingReadingService(PlannedService):
    """Run the sharded, per-item part of the pipeline in worker processes.

    Each worker runs a copy of the pipeline up to the sharding point, keeps
    its shard, and runs the per-item blocks after it (and, when the items map
    one-to-one, ``batch``/``collate`` too). Outputs cross shared memory and
    are merged by source position: the result equals the in-process result
    for any ``num_workers``.

    Args:
        num_workers: worker processes; 0 runs everything in the calling thread.
        prefetch_factor: outputs each worker may hold ahead of the consumer.
        start_method: ``"fork"``, ``"spawn"``, ``"forkserver"`` or None (the
            platform default). Under spawn/forkserver the pipeline is sent with
            cloudpickle, so lambdas work. Under spawn, workers start from
            pipeloom's start server (``docs/reading_services.md``), which this
            constructor starts in the background if it is not running yet, so
            its start overlaps what the program does before the first epoch
            (building the model, loading a checkpoint).
        worker_init_fn: called as ``worker_init_fn(worker_id)`` once in each
            worker, after its RNGs are seeded.
        persistent_workers: keep the workers alive between epochs.
        timeout: seconds to wait for the next output before raising
            ``TimeoutError`` (None: wait as long as the workers live).
        in_order: merge by source position (True) or by arrival (False).
        strategy: how work is split (``docs/reading_services.md``; each in
            ``strategies/`` under its own name):

            * ``"classic"``: each worker runs a copy of the source, keeps its
              shard and, when items map one-to-one, builds whole batches;
              ``prefetch_factor`` outputs per worker. Works with any
              pipeline that has a sharding point.
            * ``"economic"``: the main process reads the source and hands each
              item to the least loaded of ``num_workers`` item workers; batch
              workers assemble and collate; at most ``prefetch_factor``
              batches are in flight in total, so memory does not grow with
              ``num_workers``. Needs ``.batch(n)`` right after the per-item
              blocks, and every block between the sharding point and it must
              yield one output per input (no ``filter``, ``flatmap``, tar
              member loading there).
            * ``"chunked"``: runs of ``chunk_size`` items of a batch go to
              different workers and are reassembled in order in the main
              process, so the first batch is built by many workers at once.
              Needs ``.batch(n)`` right after the per-item blocks (filters
              and flatmaps before it are fine).

            Under economic and chunked the sharding point and its upstream run
            in the main process, and what the sharding point yields crosses to
            the workers, so it must be picklable (a path or an index, not an
            open file); ``in_order=False`` applies to classic only. A pipeline
            a strategy cannot run is refused when the ``DataLoader`` is built,
            saying what to move.
            Every strategy yields the same items in the same order.
        num_batch_workers: batch workers under ``"economic"`` (more than
            ``prefetch_factor`` cannot help). 0: no batch workers; the main
            process gives each item worker whole batches, which it builds and
            collates itself (still at most ``prefetch_factor`` batches in
            flight). Default: 0 when ``prefetch_factor`` batches in flight
            keep every usable core busy (``prefetch_factor >= min(num_workers,
            cores)``), since a batch split over workers then only adds work;
            else ``prefetch_factor``.
        chunk_size: items per chunk under ``"chunked"`` (default: the batch
            spread evenly over the workers, or over the usable cores when
            fewer, or one item per chunk when the
            per-item blocks may make several outputs of one input, such as a
            tar shard's samples); at most the batch size.
        warm_start: under spawn or forkserver, start the worker processes in a
            background thread and meanwhile run the workers' part in
            ``num_workers`` threads of this process, so the first batches come
            as soon as in-process ones, whatever the dataset's size; between
            two outputs once the processes are up, the epoch moves to them
            (no output repeated or dropped, the order unchanged). Classic
            only, without ``worker_init_fn`` (the threads could not run it).
            Items drawn from ``item_rng()`` are the same wherever they are
            made; draws from the global RNGs in the threads are the main
            process's. Under fork (workers start in milliseconds), for ranks
            and for pipelines with a separate-process block it changes
            nothing. See ``docs/reading_services.md`` (warm start).
        reseed_global_rngs: seed each worker's global RNGs (``random``, NumPy,
            torch) from (seed, epoch, worker id) at every epoch (True), or
            only when the worker starts (False): then a persistent worker's
            streams run on from epoch to epoch, as torch's workers' do
            (``pipeloom.compat.DataLoader`` uses it), and draw other values
            after an abandoned epoch than after a finished one. Ending an
            abandoned epoch then waits for the workers as torch's does (up to
            ``timeout``; None: while they live) instead of restarting those
            still busy after 5 s. Classic only (economic and chunked seed them
            per item).

    Example:
        >>> from pipeloom import DataLoader
        >>> from pipeloom.datapipes import IterableWrapper
        >>> pipe = IterableWrapper(range(6)).sharding_filter().map(lambda x: -x)
        >>> with DataLoader(pipe, MultiProcessingReadingService(2), seed=0) as loader:
        ...     list(loader)
        [0, -1, -2, -3, -4, -5]
    """

    def __init__(
        self,
        num_workers: int,
        prefetch_factor: int = 2,
        start_method: str | None = None,
        worker_init_fn: Callable[[int], None] | None = None,
        persistent_workers: bool = False,
        timeout: float | None = None,
        *,
        in_order: bool = True,
        strategy: str = "classic",
        num_batch_workers: int | None = None,
        chunk_size: int | None = None,
        reseed_global_rngs: bool = True,
        warm_start: bool = False,
    ) -> None:
        check_int("num_workers", num_workers, minimum=0, hint="use 0 to load in the calling thread")
        check_int(
            "prefetch_factor", prefetch_factor, minimum=1, hint="it counts outputs per worker"
        )
        check_bool("persistent_workers", persistent_workers)
        check_bool("in_order", in_order)
        check_bool("reseed_global_rngs", reseed_global_rngs)
        check_bool("warm_start", warm_start)
        _check_warm_start(warm_start, strategy, worker_init_fn)
        _check_strategy_args(strategy, prefetch_factor, num_batch_workers, chunk_size, in_order)
        if not reseed_global_rngs and strategy != "classic":
            raise ValueError(
                f"reseed_global_rngs=False only applies to strategy='classic', got it with "
                f"strategy={strategy!r}, which seeds the global RNGs before each item; "
                f"drop it or use strategy='classic'"
            )
        choices = multiprocessing.get_all_start_methods()
        check_choice("start_method", start_method, choices, allow_none=True)
        check_callable("worker_init_fn", worker_init_fn, allow_none=True)
        check_seconds("timeout", timeout, allow_none=True)
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.start_method = start_method
        self.worker_init_fn = worker_init_fn
        self.persistent_workers = persistent_workers
        self.timeout = timeout
        self.in_order = in_order
        self.strategy = strategy
        self.num_batch_workers = (
            default_batch_workers(num_workers, prefetch_factor)
            if num_batch_workers is None
            else num_batch_workers
        )
        self.chunk_size = chunk_size
        self.reseed_global_rngs = reseed_global_rngs
        self.warm_start = warm_start
        if num_workers > 0 and isinstance(worker_context(start_method), ServedContext):
            start_server()  # not waited for: it imports torch while the program goes on
        # The one place the strategy matters: which runner initialize() builds. A plain
        # function, not a bound method: a service holding its own method is a reference
        # cycle, which would keep its workers' runner alive until a garbage collection.
        self._make: Callable[[MultiProcessingReadingService, IterDataPipe], Runner] = (
            MultiProcessingReadingService._in_process
            if num_workers == 0
            else _RUNNER_MAKERS[strategy]
        )

    @property
    def delivers_in_arrival_order(self) -> bool:
        return not self.in_order

    def plan(self, pipeline: IterDataPipe) -> Plan:
        if self.num_workers == 0:
            return make_plan(pipeline, Settings("in-process", outer=self.outer))
        return make_plan(pipeline, self._settings(self.strategy))

    def make_runner(self, pipeline: IterDataPipe) -> Runner:
        return self._make(self, pipeline)

    def _settings(self, strategy: str) -> Settings:
        return Settings(
            strategy,
            workers=self.num_workers,
            batch_workers=self.num_batch_workers,
            prefetch=self.prefetch_factor,
            chunk_size=self.chunk_size,
            outer=self.outer,
            cores=_usable_cores(),
        )

    def _in_process(self, pipeline: IterDataPipe) -> Runner:
        return InProcessRunner(pipeline, self.plan(pipeline))

    def _classic(self, pipeline: IterDataPipe) -> Runner:
        plan = self.plan(pipeline)
        options = _ClassicOptions(
            count=self.num_workers,
            prefetch=self.prefetch_factor,
            start_method=self.start_method,
            worker_init_fn=self.worker_init_fn,
            persistent=self.persistent_workers,
            timeout=self.timeout,
            reseed_global_rngs=self.reseed_global_rngs,
            in_order=self.in_order,
        )
        threads = self._warm_threads(pipeline, plan) if self.warm_start else None
        if threads is None:
            return _classic_runner(pipeline, plan, options)
        launch = functools.partial(_started_classic_runner, pipeline, plan, options)
        return WarmStartRunner(pipeline, plan, threads, launch)

    def _warm_threads(self, pipeline: IterDataPipe, plan: Plan) -> Runner | None:
        """The threads that run a warm start's first outputs, or None where none helps."""
        forked = worker_context(self.start_method).get_start_method() == "fork"
        separate = any(part.role == "separate process" for part in plan.parts)
        if forked or separate or self.outer != (1, 0):
            return None
        threads = ThreadReadingService(
            self.num_workers, prefetch_factor=self.prefetch_factor, in_order=self.in_order
        )
        try:
            return threads.make_runner(pipeline)
        except PlanError:
            return None

    def _dispatch(self, pipeline: IterDataPipe) -> Runner:
        plan = self.plan(pipeline)
        runner = EconomicRunner if self.strategy == "economic" else ChunkedRunner
        return runner(
            pipeline,
            plan,
            start_method=self.start_method,
            worker_init_fn=self.worker_init_fn,
            persistent_workers=self.persistent_workers,
            timeout=self.timeout,
            prefetch=self.prefetch_factor,
        )

    def __repr__(self) -> str:
        return (
            f"MultiProcessingReadingService(num_workers={self.num_workers}, "
            f"prefetch_factor={self.prefetch_factor}, start_method={self.start_method!r}, "
            f"persistent_workers={self.persistent_workers}, strategy={self.strategy!r}"
            f"{', warm_start=True' if self.warm_start else ''})"
        )


@dataclasses.dataclass(frozen=True)
class _ClassicOptions:
    """The service's arguments a classic runner over processes is built from."""

    count: int
    prefetch: int
    start_method: str | None
    worker_init_fn: Callable[[int], None] | None
    persistent: bool
    timeout: float | None
    reseed_global_rngs: bool
    in_order: bool


def _classic_runner(pipeline: IterDataPipe, plan: Plan, options: _ClassicOptions) -> ClassicRunner:
    pool = ProcessPool(
        plan,
        seed=workers_seed(block_seed(plan.part("workers").exit), plan.outer),  # type: ignore[arg-type]
        count=options.count,
        prefetch=options.prefetch,
        start_method=options.start_method,
        worker_init_fn=options.worker_init_fn,
        persistent=options.persistent,
        timeout=options.timeout,
        reseed_global_rngs=options.reseed_global_rngs,
    )
    return ClassicRunner(
        pipeline,
        plan,
        pool,
        in_order=options.in_order,
        timeout=options.timeout,
        start_method=options.start_method,
        prefetch=options.prefetch,
    )


def _started_classic_runner(
    pipeline: IterDataPipe, plan: Plan, options: _ClassicOptions
) -> ClassicRunner:
    """A classic runner whose worker processes are started (a warm start's background)."""
    runner = _classic_runner(pipeline, plan, options)
    try:
        cast(ProcessPool, runner.pool).start_processes()
    except BaseException:
        runner.shutdown()
        raise
    return runner


def _check_warm_start(warm_start: bool, strategy: str, worker_init_fn: Any) -> None:
    """Explain a warm start that cannot work."""
    if not warm_start:
        return
    if strategy != "classic":
        raise ValueError(
            f"warm_start=True only applies to strategy='classic', got strategy={strategy!r}, "
            f"whose epochs cannot move between threads and processes; drop warm_start or use "
            f"strategy='classic'"
        )
    if worker_init_fn is not None:
        raise ValueError(
            f"warm_start=True runs the first outputs in threads of this process, which cannot "
            f"run worker_init_fn={worker_init_fn!r} (it would run in the main process); drop "
            f"one of them"
        )


_RUNNER_MAKERS = {
    "classic": MultiProcessingReadingService._classic,
    "economic": MultiProcessingReadingService._dispatch,
    "chunked": MultiProcessingReadingService._dispatch,
}


def _check_strategy_args(
    strategy: Any, prefetch_factor: int, num_batch_workers: Any, chunk_size: Any, in_order: bool
) -> None:
    """Explain strategy arguments that cannot work."""
    check_choice("strategy", strategy, STRATEGIES)
    _check_option("num_batch_workers", num_batch_workers, strategy, "economic", minimum=0)
    _check_option("chunk_size", chunk_size, strategy, "chunked", minimum=1)
    if num_batch_workers is not None and num_batch_workers > prefetch_factor:
        warnings.warn(
            f"num_batch_workers={num_batch_workers} > prefetch_factor={prefetch_factor}: "
            f"at most prefetch_factor batches are in flight, so the extra batch workers "
            f"stay idle; raise prefetch_factor or lower num_batch_workers",
            stacklevel=3,
        )
    if strategy != "classic" and not in_order:
        raise ValueError(
            f"in_order=False only applies to strategy='classic'; strategy={strategy!r} "
            f"delivers in order at no cost"
        )


def default_batch_workers(num_workers: int, prefetch_factor: int) -> int:
    """Economic's batch workers when not given: none when whole batches fill the cores.

    Example:
        >>> default_batch_workers(2, 2)  # 2 batches in flight keep 2 workers busy
        0
    """
    return 0 if prefetch_factor >= min(num_workers, _usable_cores()) else prefetch_factor


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _check_option(name: str, value: Any, strategy: str, owner: str, *, minimum: int) -> None:
    if value is None:
        return
    if strategy != owner:
        raise ValueError(
            f"{name} only applies to strategy={owner!r}, got it with strategy={strategy!r}; "
            f"drop it or use strategy={owner!r}"
        )
    check_int(name, value, minimum=minimum)
