"""Classic workers in processes: each runs a replica of the workers' part, epoch after epoch.

Processes start at the first epoch (started, watched and stopped with
``workers/process.py``). Each waits on its control pipe for a
:class:`~...workers.messages.StartEpoch`, produces that epoch into its
shared-memory queue, and waits again; persistent workers live on between
epochs, and an abandoned epoch is cancelled through a shared flag.
"""

from __future__ import annotations

import multiprocessing.connection
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ...._shutdown import Steps, finalize_here, interrupts_held
from ....datapipes.runtime import RestOfEpoch, set_output_queue
from ....errors import NotAvailable, QueueError, StateError, WorkerError
from ....events import FdReadiness, ReadinessSource
from ....graph import Plan
from ....queues import ProcessQueue
from ...planning.cut import assembles_batches
from ...planning.sharding import find_in_copy, index_in_part, keep_shard
from ...workers.epoch import EpochCancelled, produce_epoch
from ...workers.failure import Failure, capture_failure
from ...workers.info import WorkerInfo, set_process_worker_info
from ...workers.messages import END, StartEpoch, Stop
from ...workers.process import (
    ExitWatch,
    Payload,
    WorkerProcess,
    bootstrap,
    parent_watch,
    stop_processes,
    worker_context,
)
from ...workers.rngs import seed_worker_rngs, worker_seed
from ...workers.shared_flag import SharedFlag
from .assemble import BatchChain, LocalRing, Ring, produce_assembled_epoch
from .merge import WorkerChannel

__all__ = ["ProcessPool"]

CANCEL_TIMEOUT = 5.0
"""Seconds persistent workers get to end a cancelled epoch before they are stopped."""


class ProcessPool:
    """``count`` worker processes running the workers' part of a classic plan.

    Args:
        plan: the plan; its ``"workers"`` part is what each process runs.
        seed: the seed worker seeds derive from.
        count, prefetch, start_method, worker_init_fn, persistent: as for
            ``MultiProcessingReadingService``.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        seed: int,
        count: int,
        prefetch: int,
        start_method: str | None,
        worker_init_fn: Callable[[int], None] | None,
        persistent: bool,
        timeout: float | None = None,
        reseed_global_rngs: bool = True,
    ) -> None:
        workers = plan.part("workers")
        assert workers.exit is not None and plan.sharding_point is not None
        self.context: Any = worker_context(start_method)
        self.payload = Payload(workers.exit, self.context, start_timeout=timeout)
        self.shard = _Shard(
            index_in_part(workers.exit, plan.sharding_point), count, plan.group_size, plan.outer
        )
        self.assembled = assembles_batches(workers.exit, plan.sharding_point)
        self.seed = seed
        self.count = count
        self.prefetch = prefetch
        self.worker_init_fn = worker_init_fn
        self.persistent = persistent
        self.reseed_global_rngs = reseed_global_rngs
        self.timeout = timeout
        self._processes: _Processes | None = None
        self._lost: WorkerError | None = None  # a persistent worker found dead between epochs

    def start_epoch(
        self, epoch: int, resume: int | RestOfEpoch | None, skip: int = 0
    ) -> Sequence[WorkerChannel]:
        if self._lost is not None:  # said once; the next epoch starts new workers
            lost, self._lost = self._lost, None
            raise lost
        if self._processes is None:
            self._processes = _Processes(self)
        try:
            self._processes.start_epoch(epoch, resume, skip)
        except BaseException:  # Ctrl-C between two workers: some run the epoch, some not
            self._stop_processes()  # so the next epoch starts new ones
            raise
        return self._processes.channels

    def start_processes(self) -> None:
        """Start the worker processes now; they wait for an epoch (``warm_start.py``)."""
        if self._processes is None:
            self._processes = _Processes(self)

    def finish_epoch(self, *, abandoned: bool) -> None:
        if self._processes is None or (self.persistent and not abandoned):
            return
        if self.persistent:
            try:
                if self.reseed_global_rngs:
                    self._processes.cancel_epoch()
                else:  # restarted workers would lose their RNG streams: wait as torch's
                    # _reset waits for its workers, up to timeout (None: while they live)
                    patient = self.timeout is None
                    self._processes.cancel_epoch(self.timeout or CANCEL_TIMEOUT, patient=patient)
                return
            except (WorkerError, QueueError) as error:  # a worker died: not to be hidden
                self._lost = self._processes.dead_worker(error)
            except TimeoutError:
                pass
            except BaseException:  # Ctrl-C: some workers may still send the old epoch
                self._stop_processes()
                raise
        self._stop_processes()  # the payload's template stays, for the next epoch's workers

    def stop(self) -> None:
        """Stop the workers and end the payload's template (spawn), if any."""
        with Steps() as steps:
            steps.run(self._stop_processes)
            steps.run(self.payload.close)

    def _stop_processes(self) -> None:
        processes, self._processes = self._processes, None
        if processes is not None:
            processes.stop()  # runs to its end even if interrupted (finalize_here)

    def queues(self) -> list[tuple[str, Any]]:
        processes = self._processes
        if processes is None:
            return []
        outputs = [
            (f"worker process {i} -> main", c.queue) for i, c in enumerate(processes.channels)
        ]
        ring = [(f"baton ring -> worker process {i}", q) for i, q in enumerate(processes.inboxes)]
        return outputs + ring


class _Shard:
    """Which shard worker ``index`` keeps, in its copy of the workers' part."""

    def __init__(
        self, point_index: int, count: int, group_size: int, outer: tuple[int, int]
    ) -> None:
        self.point_index = point_index
        self.count = count
        self.group_size = group_size
        self.outer = outer

    def apply(self, pipe: Any, index: int) -> Any:
        point = find_in_copy(pipe, self.point_index)
        keep_shard(
            point, workers=self.count, index=index, group_size=self.group_size, outer=self.outer
        )
        return point


class _ProcessChannel:
    """The main process's end of one worker: its queue and its liveness."""

    def __init__(self, worker: WorkerProcess, queue: ProcessQueue, siblings: ExitWatch) -> None:
        self.worker = worker
        self.queue = queue
        self.siblings = siblings  # every worker of the pool, this one included
        self.ended = False  # this epoch's END (or Failure) was read

    def get_nowait(self) -> Any:
        try:
            message = self.queue.get(block=False)
        except NotAvailable:
            if self.siblings.any_exited():  # one poll for the pool, not two calls per worker
                if self.worker.exit_code() is not None:
                    message = self._last_words()
                    if message is None:
                        raise self.worker.died() from None
                    return message
                self._check_siblings()
            raise
        except QueueError as error:
            raise self.worker.died(error) from error
        return self._seen(message)

    def raise_gone(self) -> NoReturn:
        """Raise for a worker found gone: the Failure it sent before exiting, else its death
        (e.g. a pipeline that failed to unpickle, found when its epoch could not be sent)."""
        message = self._last_words()
        if isinstance(message, Failure):
            message.raise_here()
        raise self.worker.died()

    def _last_words(self) -> Any:
        """What an exited worker sent before exiting (a Failure), read after its exit was
        seen: the queue was empty a moment before, as the worker still wrote; or None."""
        try:
            return self._seen(self.queue.get(block=False))
        except (NotAvailable, QueueError):
            return None

    def _seen(self, message: Any) -> Any:
        if message is END or isinstance(message, Failure):
            self.ended = True
        return message

    def _check_siblings(self) -> None:
        """Raise if another worker was killed: its sentinel wakes the merge once, but the
        merge asks only this worker (the owner of the next position), so without this it
        would wait for this worker's next item before noticing the death.
        A clean exit (code 0, e.g. after sending a worker_init_fn failure) is left to the merge.
        """
        for other in self.siblings.workers:
            if other is not self.worker and other.exit_code() not in (None, 0):
                raise other.died()

    def readiness(self) -> Sequence[ReadinessSource]:
        return [self.queue.readiness(), FdReadiness(self.worker.sentinel)]


class _Processes:
    """The started processes of a pool, their queues, control pipes and cancel flags.

    Nothing here refers back to it: when the pool drops it (or the loader is
    dropped), reference counting runs the finalizer, which stops the workers.
    """

    def __init__(self, pool: ProcessPool) -> None:
        self.workers: list[WorkerProcess] = []
        self.channels: list[_ProcessChannel] = []
        self.controls: list[Any] = []
        self.cancels: list[SharedFlag] = []
        # Assembled batches: worker i's ring inbox, fed by worker i - 1 (assemble.py).
        # One baton goes round, plus at most a stop baton and an abandoned epoch's.
        inboxes = [ProcessQueue(capacity=4) for _ in range(pool.count)] if pool.assembled else []
        self.inboxes = inboxes
        queues = list(inboxes)
        # Registered before the first worker starts, its lists filled as they start: a
        # start that fails (Ctrl-C, a fork refused) stops the workers started before it.
        self._finalizer = finalize_here(
            self, _stop, self.workers, queues, self.controls, self.cancels
        )
        try:
            sentinels = ExitWatch(self.workers)
            for index in range(pool.count):
                self._start(pool, index, queues, sentinels)
        except BaseException:
            self._finalizer()
            raise

    def _start(
        self, pool: ProcessPool, index: int, queues: list[ProcessQueue], sentinels: ExitWatch
    ) -> None:
        """Start worker ``index``, each of its resources listed for the stop once made."""
        ring: Ring | None = None
        if pool.assembled:
            inboxes = self.inboxes
            ring = (
                Ring(inboxes[index], inboxes[(index + 1) % pool.count])
                if pool.count > 1
                else LocalRing()
            )
        queue = ProcessQueue(capacity=pool.prefetch, owner="consumer")
        queues.append(queue)
        cancel = SharedFlag()
        self.cancels.append(cancel)
        receive, send = pool.context.Pipe(duplex=False)
        self.controls.append(send)
        with interrupts_held():  # a started process is listed before Ctrl-C can land
            worker = WorkerProcess(
                pool.context,
                f"worker process {index}",
                _worker_main,
                (
                    pool.payload,
                    queue,
                    receive,
                    cancel,
                    index,
                    pool.count,
                    pool.seed,
                    pool.shard,
                    pool.worker_init_fn,
                    ring,
                    pool.reseed_global_rngs,
                ),
                process_name=f"pipeloom-worker-{index}",
            )
            self.workers.append(worker)
        receive.close()
        self.channels.append(_ProcessChannel(worker, queue, sentinels))

    def start_epoch(self, epoch: int, resume: int | RestOfEpoch | None, skip: int = 0) -> None:
        for channel, control, cancel in zip(self.channels, self.controls, self.cancels):
            cancel.clear()
            channel.ended = False
            try:
                control.send(StartEpoch(epoch, resume, skip))
            except OSError:  # it exited, maybe saying why first
                channel.raise_gone()

    def cancel_epoch(self, timeout: float = CANCEL_TIMEOUT, *, patient: bool = False) -> None:
        """Make persistent workers end the current epoch early; drop what they sent.

        ``patient``: after ``timeout`` seconds without a message from a worker,
        wait again while it lives (still starting, or in a long fetch).
        """
        for cancel in self.cancels:
            cancel.set()
        for channel in self.channels:
            while not channel.ended:  # a worker whose END was read has nothing more to send
                try:
                    message = channel.queue.get(timeout=timeout)
                except TimeoutError:
                    if patient and channel.worker.exit_code() is None:
                        continue
                    raise
                channel.ended = message is END or isinstance(message, Failure)

    def dead_worker(self, cause: BaseException) -> WorkerError | None:
        """The error naming a worker that exited unreported (``cause``: how it was noticed)."""
        for worker in self.workers:
            if worker.exit_code() is not None and not worker.reported:
                return worker.died(cause)
        return None

    def stop(self) -> None:
        self._finalizer()


def _stop(
    workers: list[WorkerProcess],
    queues: list[ProcessQueue],
    controls: list[Any],
    cancels: list[SharedFlag],
) -> None:
    with Steps() as steps:
        for control in controls:
            steps.run(_send_stop, control)
        for queue in queues:
            steps.run(queue.close)
        steps.run(stop_processes, workers)
        for cancel in cancels:
            steps.run(cancel.close)


def _send_stop(control: Any) -> None:
    try:
        control.send(Stop())
    except OSError:  # the worker is gone, or the pipe was closed already
        pass
    control.close()


def _worker_main(
    payload: Payload,
    queue: ProcessQueue,
    control: Any,
    cancel: SharedFlag,
    index: int,
    count: int,
    seed: int,
    shard: _Shard,
    worker_init_fn: Callable[[int], None] | None,
    ring: Ring | None = None,
    reseed_global_rngs: bool = True,
) -> None:
    """A classic worker process: wait for an epoch, produce it, repeat until told to stop.

    Its global RNGs are seeded at every epoch, or (``reseed_global_rngs=False``)
    at the first only, so their streams run on across epochs as torch's do.
    """
    label = bootstrap(f"worker process {index}", reuse_freed_memory=True)
    set_output_queue(queue)  # batches are collated into its shared memory
    try:
        pipe = payload.load()
    except Exception as error:  # noqa: BLE001 - surfaced in the main process
        _report(queue, capture_failure(error, f"{label}, unpickling the pipeline sent to it"))
        return
    point = shard.apply(pipe, index)
    chain = BatchChain(pipe) if ring is not None else None
    parent = parent_watch()
    initialized = False
    generation = 0
    while True:
        command = _receive(control, parent)
        if not isinstance(command, StartEpoch):
            return  # Stop, or the main process is gone
        generation += 1
        own_seed = worker_seed(seed, command.epoch, index)
        if reseed_global_rngs or not initialized:
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
            if type(message) is tuple:  # an output (not END, a marker or a Failure):
                queue.wait_for_room()  # make the next one only when it fits, as torch's
                # prefetch_factor counts the batch being made among those in flight
                if cancel.is_set():  # the room came from the cancel's drain: make no
                    cancelled.append(True)  # output nobody reads (torch's worker makes
                    raise EpochCancelled  # none past prefetch_factor either)

        if chain is not None and ring is not None:
            produced = produce_assembled_epoch(
                chain,
                point,
                put,
                ring,
                epoch=command.epoch,
                generation=generation,
                index=index,
                count=count,
                run_size=shard.group_size,
                worker_label=label,
                resume=_assembled_resume(command),
            )
        else:
            resume = None if command.resume is None else (point, command.resume)
            produced = produce_epoch(
                pipe, put, epoch=command.epoch, worker_label=label, resume=resume
            )
        if not produced:
            return  # the main process is gone
        if cancelled:  # the epoch was abandoned: end it with exactly one END
            try:
                queue.put(END)
            except QueueError:  # the main process stopped the pool meanwhile
                return


def _receive(control: Any, parent: list[int]) -> Any:
    """The next message on the control pipe; ``Stop()`` when the main process is gone."""
    try:
        ready = multiprocessing.connection.wait([control, *parent])
        if control not in ready:
            return Stop()
        return control.recv()
    except (EOFError, OSError):
        return Stop()


def _run_init(
    worker_init_fn: Callable[[int], None], index: int, queue: ProcessQueue, label: str
) -> bool:
    try:
        worker_init_fn(index)
        return True
    except Exception as error:  # noqa: BLE001 - surfaced in the main process
        _report(queue, capture_failure(error, f"{label}, in worker_init_fn({index})"))
        return False


def _report(queue: ProcessQueue, failure: Failure) -> None:
    """Send ``failure`` to the main process (unless it stopped the pool meanwhile)."""
    try:
        queue.put(failure)
    except QueueError:
        pass


def _assembled_resume(command: StartEpoch) -> tuple[int, int] | None:
    """Where a worker building assembled batches resumes: (position, outputs to skip there)."""
    if command.resume is None:
        return None
    if isinstance(command.resume, RestOfEpoch):  # the planner never assembles under ranks
        raise StateError("the rest of an epoch of other ranks cannot resume assembled batches")
    return command.resume, command.skip
