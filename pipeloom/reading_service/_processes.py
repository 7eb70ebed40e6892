"""Worker replicas in processes, joined to the main process by shared-memory queues."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy.random  # noqa: F401 - see _PREIMPORTED below
import torch

from .._validate import check_bool, check_callable, check_choice, check_int, check_seconds
from ..datapipes import IterDataPipe
from ..datapipes.runtime import block_seed, forget_lazy_init, restore_stamp
from ..errors import NotAvailable, QueueError, WorkerError
from ..events import FdReadiness, ReadinessSource
from ..graph import Placement
from ..queues import ProcessQueue
from ._base import ReadingService
from ._dispatch_plan import check_strategy_args
from ._dispatch_runner import DispatchRunner
from ._failure import Failure
from ._in_process import InProcessReadingService, drain
from ._merge import END, WorkerMerge, tail_state
from ._pickling import dumps_pipeline, loads_pipeline
from ._plan import WorkerPlan, root_epoch_seed
from ._process_exit import describe_exit, exit_code, join_or_kill
from ._split import split_for_workers, start_main_epoch
from ._start import worker_context
from ._worker_info import WorkerInfo, set_process_worker_info
from ._worker_loop import (
    EpochCancelled,
    apply_sharding,
    keep_freed_memory_for_reuse,
    produce_epoch,
    seed_worker_rngs,
    worker_seed,
)

__all__ = ["MultiProcessingReadingService"]

_START_METHODS = ("fork", "spawn", "forkserver")
# Every worker seeds NumPy's global RNG, and NumPy 2 imports ``numpy.random``
# lazily: imported here once, a forked worker inherits it instead of spending
# ~10 ms of CPU importing it at each start (each epoch without persistent_workers).
_PREIMPORTED = (numpy.random,)


class MultiProcessingReadingService(ReadingService):
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
            cloudpickle, so lambdas work.
        worker_init_fn: called as ``worker_init_fn(worker_id)`` once in each
            worker, after its RNGs are seeded.
        persistent_workers: keep the workers alive between epochs.
        timeout: seconds to wait for the next output before raising
            ``TimeoutError`` (None: wait as long as the workers live).
        in_order: merge by source position (True) or by arrival (False).
        strategy: how work is split (``docs/performance.md``):

            * ``"classic"``: each worker runs a copy of the source, keeps its
              shard and, when items map one-to-one, builds whole batches;
              ``prefetch_factor`` outputs per worker.
            * ``"economic"``: the main process reads the source and hands each
              item to the least loaded of ``num_workers`` item workers; batch
              workers assemble and collate; at most ``prefetch_factor``
              batches are in flight in total, so memory does not grow with
              ``num_workers``. Needs ``.batch()`` after the per-item blocks.
            * ``"chunked"``: runs of ``chunk_size`` items of a batch go to
              different workers and are reassembled in order in the main
              process, so the first batch is built by many workers at once.

            Every strategy yields the same items in the same order.
        num_batch_workers: batch workers under ``"economic"`` (default:
            ``prefetch_factor``; more cannot help).
        chunk_size: items per chunk under ``"chunked"`` (default: the batch
            spread evenly over the workers); at most the batch size.

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
    ) -> None:
        check_int("num_workers", num_workers, minimum=0, hint="use 0 to load in the calling thread")
        check_int(
            "prefetch_factor", prefetch_factor, minimum=1, hint="it counts outputs per worker"
        )
        check_bool("persistent_workers", persistent_workers)
        check_bool("in_order", in_order)
        check_strategy_args(strategy, prefetch_factor, num_batch_workers, chunk_size, in_order)
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
        self.num_batch_workers = prefetch_factor if num_batch_workers is None else num_batch_workers
        self.chunk_size = chunk_size
        self._inline = InProcessReadingService() if num_workers == 0 else None
        self._dispatch: DispatchRunner | None = None
        if strategy != "classic" and num_workers > 0:
            self._dispatch = DispatchRunner(
                strategy=strategy,
                num_workers=num_workers,
                num_batch_workers=self.num_batch_workers,
                prefetch_factor=prefetch_factor,
                chunk_size=chunk_size,
                start_method=start_method,
                worker_init_fn=worker_init_fn,
                persistent_workers=persistent_workers,
                timeout=timeout,
            )
        self._plan: WorkerPlan | None = None
        self._main: IterDataPipe | None = None
        self._merge: WorkerMerge | None = None
        self._workers: _WorkerPool | None = None
        self._epoch_open = False
        self._outer = (1, 0)

    def set_outer_sharding(self, total: int, index: int) -> None:
        if self._inline is not None:
            self._inline.set_outer_sharding(total, index)
        if self._dispatch is not None:
            self._dispatch.outer_sharding = (total, index)
        self._outer = (total, index)

    # -- ReadingService ------------------------------------------------------
    def initialize(self, pipeline: IterDataPipe) -> None:
        if self._inline is not None:
            self._inline.initialize(pipeline)
            return
        if self._dispatch is not None:
            self._dispatch.initialize(pipeline)
            return
        part = split_for_workers(
            pipeline,
            in_order=self.in_order,
            start_method=self.start_method,
            prefetch=self.prefetch_factor,
            outer=self._outer,
        )
        plan = part.plan
        self._part = part
        self._main, self._merge, self._separate = part.pipeline, part.merge, part.separate
        self._plan = plan
        context = worker_context(self.start_method)
        self._payload: Any = plan.exit
        if context.get_start_method() != "fork":
            self._payload = dumps_pipeline(plan.exit)

    def start_epoch(self, epoch: int, state: dict[str, Any] | None = None) -> Iterator[Any]:
        if self._inline is not None:
            return self._inline.start_epoch(epoch, state)
        if self._dispatch is not None:
            return self._dispatch.start_epoch(epoch, state)
        assert self._plan is not None and self._main is not None and self._merge is not None
        self._finish_epoch(abandoned=self._epoch_open)
        resume = start_main_epoch(self._part, epoch, state)
        if self._workers is None:
            self._workers = _WorkerPool(self)
        self._workers.start_epoch(epoch, resume)
        self._epoch_open = True
        self._merge.attach(
            self._workers.channels, seed=root_epoch_seed(self._plan, epoch), epoch=epoch
        )
        for reader in self._separate:
            reader.start(epoch)
        return drain(self._main, on_close=self._on_epoch_closed, timeout=self.timeout)

    def state_dict(self) -> dict[str, Any]:
        if self._inline is not None:
            return self._inline.state_dict()
        if self._dispatch is not None:
            return self._dispatch.state_dict()
        assert self._main is not None
        return tail_state(self._main)

    def placement(self) -> Placement:
        if self._inline is not None:
            return self._inline.placement()
        if self._dispatch is not None:
            return self._dispatch.placement()
        assert self._plan is not None
        return self._plan.placement(f"worker processes x{self.num_workers}", "main process")

    def shutdown(self) -> None:
        if self._dispatch is not None:
            self._dispatch.shutdown()
        for reader in getattr(self, "_separate", ()):
            reader.stop()
        if self._workers is not None:
            self._workers.stop()
            self._workers = None
        self._epoch_open = False

    # -- epochs ----------------------------------------------------------------
    def _on_epoch_closed(self, finished: bool) -> None:
        # The tail may stop before the workers do (e.g. a header): then the
        # workers' epoch is abandoned too, and persistent workers must cancel it.
        assert self._merge is not None
        self._finish_epoch(abandoned=not (finished and self._merge.exhausted))

    def _finish_epoch(self, *, abandoned: bool) -> None:
        if not self._epoch_open:
            return
        self._epoch_open = False
        if self._workers is None:
            return
        if self.persistent_workers and not abandoned:
            return
        if self.persistent_workers:
            try:
                self._workers.cancel_epoch()
                return
            except (WorkerError, TimeoutError, QueueError):
                pass
        self._workers.stop()
        self._workers = None

    def __repr__(self) -> str:
        return (
            f"MultiProcessingReadingService(num_workers={self.num_workers}, "
            f"prefetch_factor={self.prefetch_factor}, start_method={self.start_method!r}, "
            f"persistent_workers={self.persistent_workers}, strategy={self.strategy!r})"
        )


class _ProcessChannel:
    """The main process's end of one worker: its queue and its liveness."""

    def __init__(
        self, index: int, queue: ProcessQueue, process: Any, pool: list[_ProcessChannel]
    ) -> None:
        self.index = index
        self.queue = queue
        self.process = process
        self.pool = pool  # every worker's channel, this one included

    @property
    def label(self) -> str:
        return f"worker process {self.index} (pid {self.process.pid})"

    def get_nowait(self) -> Any:
        try:
            return self.queue.get(block=False)
        except NotAvailable:
            if exit_code(self.process) is not None:
                self._raise_died()
            self._check_others()
            raise
        except QueueError as error:
            self.process.join(timeout=5)
            self._raise_died(error)

    def _check_others(self) -> None:
        """Raise if another worker was killed: its sentinel wakes the merge once, but the
        merge asks only this worker (the owner of the next position), so without this it
        would wait for this worker's next item before noticing the death.
        A clean exit (code 0, e.g. after sending a worker_init_fn failure) is left to the merge.
        """
        for other in self.pool:
            if other is not self and exit_code(other.process) not in (None, 0):
                other._raise_died()

    def readiness(self) -> Sequence[ReadinessSource]:
        return [self.queue.readiness(), FdReadiness(self.process.sentinel)]

    def _raise_died(self, cause: BaseException | None = None) -> None:
        code = self.process.exitcode
        how = "closed its queue" if code is None else describe_exit(code)
        raise WorkerError(
            f"{self.label} {how} before finishing its epoch; if it ran out of memory, "
            f"lower prefetch_factor or num_workers",
            worker=self.label,
        ) from cause


class _WorkerPool:
    """The worker processes, their queues and control pipes."""

    def __init__(self, service: MultiProcessingReadingService) -> None:
        plan = service._plan
        assert plan is not None
        context: Any = worker_context(service.start_method)
        count = service.num_workers
        seed = block_seed(plan.exit) or 0
        self.channels: list[_ProcessChannel] = []
        self.controls = []
        self.cancels = []
        for index in range(count):
            queue = ProcessQueue(capacity=service.prefetch_factor, owner="consumer")
            receive, send = context.Pipe(duplex=False)
            cancel = context.Event()
            process = context.Process(
                target=_worker_main,
                args=(
                    service._payload,
                    queue,
                    receive,
                    cancel,
                    index,
                    count,
                    seed,
                    plan.root_indices,
                    plan.group_size,
                    service.worker_init_fn,
                    service._outer,
                ),
                name=f"pipeloom-worker-{index}",
                daemon=True,
            )
            process.start()
            receive.close()
            self.channels.append(_ProcessChannel(index, queue, process, self.channels))
            self.controls.append(send)
            self.cancels.append(cancel)
        self._finalizer = weakref.finalize(self, _stop_processes, self.channels, self.controls)

    def start_epoch(self, epoch: int, resume: tuple[tuple[int, ...], int] | None) -> None:
        for channel, control, cancel in zip(self.channels, self.controls, self.cancels):
            cancel.clear()
            try:
                control.send(("epoch", epoch, resume))
            except OSError:
                channel._raise_died()

    def cancel_epoch(self, timeout: float = 5.0) -> None:
        """Make persistent workers end the current epoch early; drop what they sent."""
        for cancel in self.cancels:
            cancel.set()
        for channel in self.channels:
            while True:
                message = channel.queue.get(timeout=timeout)
                if message is END or isinstance(message, Failure):
                    break

    def stop(self) -> None:
        self._finalizer()


def _stop_processes(channels: list[_ProcessChannel], controls: list[Any]) -> None:
    for control in controls:
        try:
            control.send(("stop",))
        except OSError:
            pass
        control.close()
    for channel in channels:
        channel.queue.close()
    join_or_kill([channel.process for channel in channels])


def _worker_main(
    payload: Any,
    queue: ProcessQueue,
    control: Any,
    cancel: Any,
    index: int,
    count: int,
    seed: int,
    root_indices: tuple[int, ...],
    group_size: int,
    worker_init_fn: Callable[[int], None] | None,
    outer: tuple[int, int] = (1, 0),
) -> None:
    """A worker process: wait for an epoch, produce it, repeat until told to stop."""
    label = f"worker process {index} (pid {os.getpid()})"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    restore_stamp((None, 0, None))  # a forked child inherits the parent's item stamp
    # One intra-op thread per worker, as torch does; a forked child must not use the
    # OpenMP pool it inherited from a parent that already ran parallel torch ops.
    torch.set_num_threads(1)
    keep_freed_memory_for_reuse()  # batches reuse warm memory instead of fresh pages
    if isinstance(payload, bytes):
        pipe = loads_pipeline(payload)
    else:  # forked: drop what lazy_init did in the parent; it runs again here
        pipe = payload
        forget_lazy_init(pipe)
    apply_sharding(pipe, root_indices, count, index, group_size, outer)
    initialized = False
    parent = _parent_watch()
    while True:
        try:
            # Under fork, sibling workers inherit this pipe's write end, so the
            # parent's death does not close it: watch the parent itself too.
            ready = multiprocessing.connection.wait([control, *parent])
            if control not in ready:
                return
            command = control.recv()
        except (EOFError, OSError):
            return
        if command[0] == "stop":
            return
        _, epoch, resume = command
        own_seed = worker_seed(seed, epoch, index)
        seed_worker_rngs(own_seed)
        set_process_worker_info(WorkerInfo(index, count, own_seed, pipe))
        if not initialized:
            initialized = True
            if worker_init_fn is not None and not _run_init(worker_init_fn, index, queue, label):
                return

        cancelled: list[bool] = []

        def put(message: Any, cancelled: list = cancelled) -> None:
            if cancel.is_set():
                cancelled.append(True)
                raise EpochCancelled
            queue.put(message)

        if not produce_epoch(pipe, put, epoch=epoch, worker_label=label, resume=resume):
            return  # the main process is gone
        if cancelled:  # the epoch was abandoned: end it with exactly one END
            queue.put(END)


def _parent_watch() -> list[int]:
    """A pidfd that becomes readable when the parent process exits (Linux), else []."""
    try:
        return [os.pidfd_open(os.getppid())]
    except (AttributeError, OSError):
        return []


def _run_init(
    worker_init_fn: Callable[[int], None], index: int, queue: ProcessQueue, label: str
) -> bool:
    from ._failure import capture_failure

    try:
        worker_init_fn(index)
        return True
    except Exception as error:  # noqa: BLE001 - surfaced in the main process
        queue.put(capture_failure(error, f"{label}, in worker_init_fn({index})"))
        return False
