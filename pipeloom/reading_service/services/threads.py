"""Worker replicas in threads of the main process."""

from __future__ import annotations

from ..._validate import check_bool, check_int
from ...datapipes import IterDataPipe
from ...graph import Plan
from ..planning.planner import Settings, make_plan
from ..strategies.classic.runner import ClassicRunner
from ..strategies.classic.thread_pool import ThreadPool
from ..strategies.in_process import InProcessRunner
from ..strategies.runner import Runner
from ..workers.baton import resolve_mode
from .base import PlannedService

__all__ = ["ThreadReadingService"]


class ThreadReadingService(PlannedService):
    """Run the sharded, per-item part of the pipeline in ``num_threads`` threads.

    Threads share memory (no copies, no pickling) and suit I/O-bound work and
    libraries that release the GIL (decoders, torch ops). The output order is
    the in-process order, whatever the timing (``in_order=False`` trades it for
    latency). The cut is the classic strategy's (``strategies/classic/``).
    Each thread has its own copy of the blocks, but not of the built-in
    sequence a source reads (a ``list``, ``tuple``, NumPy array, ...) nor of
    the torch ``Dataset`` behind ``map(dataset.__getitem__)``: the threads
    read them concurrently, as torch's thread-based loaders read the dataset,
    so don't modify them while an epoch runs.

    Args:
        num_threads: worker threads; 0 runs everything in the calling thread.
        prefetch_factor: outputs each worker may hold ahead of the consumer.
        in_order: merge by source position (True) or by arrival (False).
        gil_baton: ``"auto"`` (the default), ``"on"`` or ``"off"``; None reads
            the ``PIPELOOM_GIL_BATON`` environment variable (else ``"auto"``).
            With the baton on, the worker threads take turns running Python,
            one output each, instead of handing the GIL to each other every
            few items; ``"auto"`` turns it on only while the threads are
            measured GIL-bound and it pays (see ``docs/reading_services.md``).
            It changes scheduling only, never the output.

    Example:
        >>> from pipeloom import DataLoader
        >>> from pipeloom.datapipes import IterableWrapper
        >>> pipe = IterableWrapper(range(8)).sharding_filter().map(lambda x: x * x)
        >>> list(DataLoader(pipe, ThreadReadingService(3)))
        [0, 1, 4, 9, 16, 25, 36, 49]
    """

    def __init__(
        self,
        num_threads: int,
        *,
        prefetch_factor: int = 2,
        in_order: bool = True,
        gil_baton: str | None = None,
    ) -> None:
        check_int("num_threads", num_threads, minimum=0, hint="use 0 to load in the calling thread")
        check_int(
            "prefetch_factor", prefetch_factor, minimum=1, hint="it counts outputs per worker"
        )
        check_bool("in_order", in_order)
        self.gil_baton = resolve_mode(gil_baton)
        self.num_threads = num_threads
        self.prefetch_factor = prefetch_factor
        self.in_order = in_order

    @property
    def delivers_in_arrival_order(self) -> bool:
        return not self.in_order

    def plan(self, pipeline: IterDataPipe) -> Plan:
        if self.num_threads == 0:
            return make_plan(pipeline, Settings("in-process", outer=self.outer))
        settings = Settings(
            "threads", workers=self.num_threads, prefetch=self.prefetch_factor, outer=self.outer
        )
        return make_plan(pipeline, settings)

    def make_runner(self, pipeline: IterDataPipe) -> Runner:
        plan = self.plan(pipeline)
        if self.num_threads == 0:
            return InProcessRunner(pipeline, plan)
        pool = ThreadPool(
            plan,
            count=self.num_threads,
            prefetch=self.prefetch_factor,
            gil_baton=self.gil_baton,
            in_order=self.in_order,
        )
        return ClassicRunner(
            pipeline,
            plan,
            pool,
            in_order=self.in_order,
            timeout=None,
            start_method=None,
            prefetch=self.prefetch_factor,
        )

    def __repr__(self) -> str:
        baton = "" if self.gil_baton == "auto" else f", gil_baton={self.gil_baton!r}"
        return (
            f"ThreadReadingService(num_threads={self.num_threads}, "
            f"prefetch_factor={self.prefetch_factor}{baton})"
        )
