"""A block marked ``is_separate_process()``, run with its upstream in a process of its own.

The main part reads it through a :class:`SeparateProcessReader` that stands in
its place: each epoch a process (started with ``process.py``, like every
worker) runs a copy of the block and everything upstream of it, and sends
``StampedOutput`` messages through a shared-memory queue, so item stamps (and
``item_rng()``) are the same as in-process.

Its checkpoint is how many outputs it delivered this epoch: a resumed process
runs its branch from the start of the epoch and drops that many before it
sends the first (the branch is seeded, so they are the same outputs).

The process seeds its global RNGs (``random``, NumPy's legacy global RNG,
torch) from (seed, epoch) at the start of each epoch, as a worker process
does: code in the branch that draws from them gives the same values in every
run, new values each epoch, and the same values again when a resume replays it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ..._shutdown import Steps, finalize_here, interrupts_held
from ...datapipes import IterDataPipe, StateFields
from ...datapipes.runtime import block_seed, derive_seed, restore_stamp
from ...errors import NotAvailable, QueueError, WorkerError
from ...events import FdReadiness, ReadinessSource
from ...queues import ProcessQueue
from .epoch import produce_epoch
from .failure import Failure
from .messages import END
from .process import Payload, WorkerProcess, bootstrap, stop_processes, worker_context
from .rngs import seed_worker_rngs, worker_seed

__all__ = ["SeparateProcessReader"]

_SEPARATE_TAG = 0x5E9A
"""Mixed into a separate process's seed: its streams differ from worker 0's."""


class SeparateProcessReader(IterDataPipe):
    """Reads a block that runs in a process of its own.

    Args:
        block: the marked block (with its upstream) to run there.
        start_method: as for the worker processes.
        prefetch: outputs the process may send ahead of the consumer.
    """

    inputs = ()  # the block runs in the other process, not in this pipeline
    restartable = False  # its stream is produced once per epoch

    def __init__(self, block: IterDataPipe, *, start_method: str | None, prefetch: int) -> None:
        self.block_repr = repr(block)
        self._context: Any = worker_context(start_method)
        self._payload = Payload(block, self._context)
        self.capacity = prefetch
        self._worker: WorkerProcess | None = None
        self._queue: ProcessQueue | None = None
        self._finalizer: weakref.finalize | None = None
        self._ended = False
        self._delivered = 0  # outputs delivered this epoch (the checkpoint)
        self._skip = 0  # of them, delivered before the checkpoint this epoch resumed from

    def start(self, epoch: int) -> None:
        """Start the process for ``epoch`` (stopping a previous one)."""
        self.stop()
        queue = ProcessQueue(capacity=self.capacity, owner="consumer")
        name = f"separate process for {self.block_repr}"
        with interrupts_held():  # a started process is kept (to be stopped) before Ctrl-C lands
            worker = WorkerProcess(
                self._context,
                name,
                _separate_main,
                (self._payload, queue, epoch, name, self._skip),
                block=self.block_repr,
                process_name="pipeloom-separate",
            )
            self._queue, self._worker = queue, worker
            self._finalizer = finalize_here(self, _stop, worker, queue)
        self._ended = False

    def stop(self) -> None:
        finalizer, self._finalizer = self._finalizer, None
        with Steps() as steps:
            if finalizer is not None:
                steps.run(finalizer)  # runs to its end even if interrupted (finalize_here)
            steps.run(self._payload.close)  # its template (spawn), if any

    def queues(self) -> list[tuple[str, ProcessQueue]]:
        """Its queue to the main process, while it runs."""
        queue = self._queue
        return [] if queue is None else [(f"separate process {self.block_repr} -> main", queue)]

    def readiness_sources(self) -> Sequence[ReadinessSource]:
        if self._queue is None or self._worker is None:
            return ()
        return [self._queue.readiness(), FdReadiness(self._worker.sentinel)]

    def async_next(self) -> Any:
        if self._ended or self._queue is None or self._worker is None:
            raise StopIteration
        message = self._read(self._queue, self._worker)
        if message is END:
            self._ended = True
            raise StopIteration
        if isinstance(message, Failure):
            message.raise_here()
        stamp, item = message
        restore_stamp(stamp)
        self._delivered += 1
        return item

    def _read(self, queue: ProcessQueue, worker: WorkerProcess) -> Any:
        try:
            return queue.get(block=False)
        except NotAvailable:
            if worker.exit_code() is None:
                raise
        except QueueError as error:
            raise self._lost_output(worker.died(error)) from error
        try:  # it died: it may have sent an output after the read above
            return queue.get(block=False)
        except (NotAvailable, QueueError):
            raise self._lost_output(worker.died()) from None

    def _lost_output(self, error: WorkerError) -> WorkerError:
        """Name the output the dead process was making: every one before it arrived."""
        error.add_detail(
            f". It was making output {self._delivered} (counted from 0) of "
            f"{self.block_repr} this epoch; the outputs before it had arrived",
            item=self._delivered,
        )
        return error

    def reset(self) -> None:
        self._delivered = self._skip = 0

    def state_dict(self) -> dict[str, Any]:
        return {"delivered": self._delivered}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._delivered = self._skip = StateFields(self, state).int("delivered")

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(
            f"{self!r} cannot be copied (its block runs in a process of its own), and a "
            f"resume on another number of ranks copies the pipeline to find each rank's "
            f"progress; resume on the same number of ranks, or drop is_separate_process()"
        )

    def __repr__(self) -> str:
        return f"SeparateProcessReader({self.block_repr})"


def _stop(worker: WorkerProcess, queue: ProcessQueue) -> None:
    with Steps() as steps:
        steps.run(queue.close)
        steps.run(stop_processes, [worker])


def _separate_main(
    payload: Payload, queue: ProcessQueue, epoch: int, name: str, skip: int = 0
) -> None:
    label = bootstrap(name)
    put = queue.put if not skip else _dropping_first(queue.put, skip)
    block = payload.load()
    seed = block_seed(block) or 0
    seed_worker_rngs(derive_seed(worker_seed(seed, epoch, 0), _SEPARATE_TAG))
    produce_epoch(block, put, epoch=epoch, worker_label=label, full_stamp=True)


def _dropping_first(put: Callable[[Any], None], count: int) -> Callable[[Any], None]:
    """``put`` that drops the first ``count`` outputs (delivered before a checkpoint)."""
    left = count

    def put_after(message: Any) -> None:
        nonlocal left
        if left and type(message) is tuple:  # an output; END and a Failure always go
            left -= 1
            return
        put(message)

    return put_after
