"""Worker replicas in threads of the main process."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

from .._validate import check_bool, check_int
from ..datapipes import IterDataPipe
from ..datapipes.runtime import block_seed
from ..events import ReadinessSource
from ..graph import Placement
from ..graph import copy as copy_pipeline
from ..queues import ThreadQueue
from ._base import ReadingService
from ._in_process import InProcessReadingService, drain
from ._merge import WorkerMerge, tail_state
from ._plan import WorkerPlan, root_epoch_seed
from ._split import split_for_workers, start_main_epoch
from ._worker_info import WorkerInfo, set_thread_worker_info
from ._worker_loop import apply_sharding, produce_epoch, worker_seed

__all__ = ["ThreadReadingService"]


class ThreadReadingService(ReadingService):
    """Run the sharded, per-item part of the pipeline in ``num_threads`` threads.

    Threads share memory (no copies, no pickling) and suit I/O-bound work and
    libraries that release the GIL (decoders, torch ops). The output order is
    the in-process order, whatever the timing (``in_order=False`` trades it for
    latency).

    Args:
        num_threads: worker threads; 0 runs everything in the calling thread.
        prefetch_factor: outputs each worker may hold ahead of the consumer.
        in_order: merge by source position (True) or by arrival (False).

    Example:
        >>> from pipeloom import DataLoader
        >>> from pipeloom.datapipes import IterableWrapper
        >>> pipe = IterableWrapper(range(8)).sharding_filter().map(lambda x: x * x)
        >>> list(DataLoader(pipe, ThreadReadingService(3)))
        [0, 1, 4, 9, 16, 25, 36, 49]
    """

    def __init__(
        self, num_threads: int, *, prefetch_factor: int = 2, in_order: bool = True
    ) -> None:
        check_int("num_threads", num_threads, minimum=0, hint="use 0 to load in the calling thread")
        check_int(
            "prefetch_factor", prefetch_factor, minimum=1, hint="it counts outputs per worker"
        )
        check_bool("in_order", in_order)
        self.num_threads = num_threads
        self.prefetch_factor = prefetch_factor
        self.in_order = in_order
        self._inline = InProcessReadingService() if num_threads == 0 else None
        self._plan: WorkerPlan | None = None
        self._main: IterDataPipe | None = None
        self._merge: WorkerMerge | None = None
        self._worker_pipes: list[IterDataPipe] = []
        self._epoch: _ThreadEpoch | None = None
        self._seed = 0
        self._outer = (1, 0)

    def set_outer_sharding(self, total: int, index: int) -> None:
        if self._inline is not None:
            self._inline.set_outer_sharding(total, index)
        self._outer = (total, index)

    def initialize(self, pipeline: IterDataPipe) -> None:
        if self._inline is not None:
            self._inline.initialize(pipeline)
            return
        part = split_for_workers(
            pipeline,
            in_order=self.in_order,
            start_method=None,
            prefetch=self.prefetch_factor,
            outer=self._outer,
        )
        plan = part.plan
        self._part = part
        self._main, self._merge, self._separate = part.pipeline, part.merge, part.separate
        self._worker_pipes = [copy_pipeline(plan.exit) for _ in range(self.num_threads)]
        for index, worker_pipe in enumerate(self._worker_pipes):
            apply_sharding(
                worker_pipe,
                plan.root_indices,
                self.num_threads,
                index,
                plan.group_size,
                self._outer,
            )
        self._plan = plan
        self._seed = block_seed(plan.exit) or 0

    def start_epoch(self, epoch: int, state: dict[str, Any] | None = None) -> Iterator[Any]:
        if self._inline is not None:
            return self._inline.start_epoch(epoch, state)
        self._stop_epoch()
        assert self._main is not None and self._merge is not None and self._plan is not None
        resume = start_main_epoch(self._part, epoch, state)
        self._epoch = _ThreadEpoch(self, epoch, resume)
        self._merge.attach(
            self._epoch.channels, seed=root_epoch_seed(self._plan, epoch), epoch=epoch
        )
        for reader in self._separate:
            reader.start(epoch)
        self._epoch.start()
        return drain(self._main, on_close=lambda finished: self._stop_epoch())

    def state_dict(self) -> dict[str, Any]:
        if self._inline is not None:
            return self._inline.state_dict()
        assert self._main is not None
        return tail_state(self._main)

    def placement(self) -> Placement:
        if self._inline is not None:
            return self._inline.placement()
        assert self._plan is not None
        return self._plan.placement(f"worker threads x{self.num_threads}", "main thread")

    def shutdown(self) -> None:
        self._stop_epoch()
        for reader in getattr(self, "_separate", ()):
            reader.stop()

    def _stop_epoch(self) -> None:
        if self._epoch is not None:
            self._epoch.stop()
            self._epoch = None

    def __repr__(self) -> str:
        return (
            f"ThreadReadingService(num_threads={self.num_threads}, "
            f"prefetch_factor={self.prefetch_factor})"
        )


class _QueueChannel:
    def __init__(self, queue: ThreadQueue) -> None:
        self.queue = queue

    def get_nowait(self) -> Any:
        return self.queue.get(block=False)

    def readiness(self) -> Sequence[ReadinessSource]:
        return [self.queue.readiness()]


class _ThreadEpoch:
    """The threads and queues of one epoch."""

    def __init__(
        self, service: ThreadReadingService, epoch: int, resume: tuple[tuple[int, ...], int] | None
    ) -> None:
        count = service.num_threads
        self.queues = [ThreadQueue(capacity=service.prefetch_factor) for _ in range(count)]
        self.channels = [_QueueChannel(q) for q in self.queues]
        self.threads = [
            threading.Thread(
                target=_run_worker,
                args=(
                    service._worker_pipes[i],
                    self.queues[i],
                    epoch,
                    i,
                    count,
                    service._seed,
                    resume,
                ),
                name=f"pipeloom-worker-{i}",
                daemon=True,
            )
            for i in range(count)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        for queue in self.queues:
            queue.close()
        for thread in self.threads:
            if thread.ident is not None:
                thread.join(timeout=10)


def _run_worker(
    pipe: IterDataPipe,
    queue: ThreadQueue,
    epoch: int,
    index: int,
    count: int,
    seed: int,
    resume: tuple[tuple[int, ...], int] | None,
) -> None:
    set_thread_worker_info(WorkerInfo(index, count, worker_seed(seed, epoch, index), pipe))
    try:
        produce_epoch(
            pipe, queue.put, epoch=epoch, worker_label=f"worker thread {index}", resume=resume
        )
    finally:
        set_thread_worker_info(None)
