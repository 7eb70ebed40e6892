"""Classic workers in threads: one replica of the workers' part per thread, for one epoch."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from ...._shutdown import Steps
from ....datapipes import IterDataPipe
from ....datapipes.runtime import RestOfEpoch, block_seed, read_only_data
from ....graph import Plan, copy
from ...planning.sharding import find_in_copy, index_in_part, keep_shard
from ...workers.baton import BatonMode, BatonPolicy, BatonStatistics, GilBaton
from ...workers.rngs import workers_seed
from ...workers.thread import WorkerThread
from .merge import WorkerChannel

__all__ = ["ThreadPool"]


class ThreadPool:
    """``count`` worker threads, started for each epoch and stopped at its end.

    Each thread has its own copy of the workers' part (made once), whose
    sharding point keeps that worker's shard. The threads of an epoch share
    a GIL baton (``workers/baton.py``) whose policy lives as long as the pool.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        count: int,
        prefetch: int,
        gil_baton: BatonMode = "auto",
        in_order: bool = True,
    ) -> None:
        workers = plan.part("workers")
        point = plan.sharding_point
        assert isinstance(workers.exit, IterDataPipe) and point is not None
        point_index = index_in_part(workers.exit, point)
        self.count = count
        self.prefetch = prefetch
        self.in_order = in_order  # the consumer waits for worker 0's first output
        self.seed = workers_seed(block_seed(workers.exit), plan.outer)
        shared = read_only_data(workers.exit)  # threads read it, none copies it
        self.copies: list[IterDataPipe] = [copy(workers.exit, share=shared) for _ in range(count)]
        self.points = [find_in_copy(c, point_index) for c in self.copies]
        for index, own_point in enumerate(self.points):
            keep_shard(
                own_point,
                workers=count,
                index=index,
                group_size=plan.group_size,
                outer=plan.outer,
            )
        self._threads: list[WorkerThread] = []
        self.baton_policy = BatonPolicy(gil_baton)
        self._baton: GilBaton | None = None

    def baton_statistics(self) -> BatonStatistics:
        return self.baton_policy.statistics()

    def start_epoch(self, epoch: int, resume: int | RestOfEpoch | None) -> Sequence[WorkerChannel]:
        gate = threading.Event()  # opened once all run: see WorkerThread
        use_baton = self.baton_policy.mode != "off" and self.count > 1
        self._baton = GilBaton(self.baton_policy) if use_baton else None
        self._threads = [
            WorkerThread(
                pipe,
                index=index,
                count=self.count,
                seed=self.seed,
                capacity=self.prefetch,
                epoch=epoch,
                resume=None if resume is None else (self.points[index], resume),
                gate=gate,
                baton=self._baton,
                watch_draws=index == 0 and resume is None and self.in_order,
            )
            for index, pipe in enumerate(self.copies)
        ]
        try:
            for thread in self._threads:
                thread.start()
        finally:
            gate.set()
        return self._threads

    def finish_epoch(self, *, abandoned: bool) -> None:
        self.stop()  # threads live for one epoch

    def queues(self) -> list[tuple[str, Any]]:
        return [(f"{thread.label} -> main", thread.queue) for thread in self._threads]

    def stop(self) -> None:
        threads, self._threads = self._threads, []
        with Steps() as steps:
            if self._baton is not None:  # no worker waits for a turn that will not come
                steps.run(self._baton.close)
            for thread in threads:
                steps.run(thread.close)
            for thread in threads:
                steps.run(thread.join)
