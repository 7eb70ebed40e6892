"""Worker threads: each runs one replica's epoch and sends its outputs to a queue.

The thread counterpart of ``process.py``: how a worker thread is started,
identified (``get_worker_info()``) and stopped. Threads live for one epoch;
closing a thread's queue makes its next ``put`` fail, which ends it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from ...datapipes import DataPipe, IterDataPipe
from ...datapipes.runtime import GlobalDrawCheck, release_pipeline
from ...events import ReadinessSource
from ...queues import ThreadQueue
from .baton import GilBaton
from .epoch import produce_epoch
from .info import WorkerInfo, set_thread_worker_info
from .rngs import worker_seed

__all__ = ["STOP_TIMEOUT", "WorkerThread"]

STOP_TIMEOUT = 10.0
"""Seconds to wait for a worker thread to end after its queue was closed."""

THREAD_DRAWS = (
    "a global RNG (random, numpy.random or torch's default generator) was drawn from "
    "while the worker threads made their first outputs. Worker threads share one "
    "interpreter's global RNGs, so what each draws depends on thread timing: other "
    "values in every run, and not the in-process run's. Draw from pipeloom.item_rng() "
    "instead (per item: the same values under every reading service), or use "
    "MultiProcessingReadingService, whose worker processes seed their own"
)


class WorkerThread:
    """One worker thread for one epoch, with the queue it fills.

    Args:
        pipe: the thread's own copy of the workers' part.
        index, count: which worker of how many.
        seed: the seed worker seeds derive from.
        capacity: outputs the queue holds ahead of the consumer.
        epoch: the epoch to produce.
        resume: ``(sharding point in pipe, position)`` to start the epoch from.
        gate: set when the thread may start producing (None: at once). Starting
            a thread waits until it runs; if the threads started before it
            already compute, the starter then waits for the GIL (up to the
            switch interval, 5 ms) once per thread, so a pool starts every
            thread first and opens the gate after.
        baton: the pool's GIL baton for this epoch (None: the thread never
            waits for one); see ``baton.py``.
        watch_draws: warn (``THREAD_DRAWS``) when a global RNG moves while the
            thread makes its first output: for the thread whose first output
            the consumer waits for, so the consumer itself draws nothing then.
    """

    def __init__(
        self,
        pipe: IterDataPipe,
        *,
        index: int,
        count: int,
        seed: int,
        capacity: int,
        epoch: int,
        resume: tuple[DataPipe, Any] | None,
        gate: threading.Event | None = None,
        baton: GilBaton | None = None,
        watch_draws: bool = False,
    ) -> None:
        self.label = f"worker thread {index}"
        # Read by whichever thread reads the loader's iterator (one at a time, under its lock).
        # Woken only by the worker whose output the merge waits for (request_item):
        # puts from workers that are ahead do not wake the consumer.
        self.queue = ThreadQueue(capacity=capacity, any_consumer_thread=True, wake_on_request=True)
        info = WorkerInfo(index, count, worker_seed(seed, epoch, index), pipe)
        self.thread = threading.Thread(
            target=_run,
            args=(pipe, self.queue, info, epoch, self.label, resume, gate, baton, watch_draws),
            name=f"pipeloom-worker-{index}",
            daemon=True,
        )

    def start(self) -> None:
        self.thread.start()

    # -- the channel the merge reads -------------------------------------------------
    def get_nowait(self) -> Any:
        self.queue.request_item()  # before the try: a put in between wakes the merge
        item = self.queue.get(block=False)
        self.queue.cancel_request()
        return item

    def readiness(self) -> Sequence[ReadinessSource]:
        return [self.queue.readiness()]

    def close(self) -> None:
        """Close the queue: the thread's next put fails, which ends it."""
        self.queue.close()

    def join(self) -> None:
        if self.thread.ident is not None:
            self.thread.join(timeout=STOP_TIMEOUT)


def _run(
    pipe: IterDataPipe,
    queue: ThreadQueue,
    info: WorkerInfo,
    epoch: int,
    label: str,
    resume: tuple[DataPipe, Any] | None,
    gate: threading.Event | None,
    baton: GilBaton | None,
    watch_draws: bool,
) -> None:
    if gate is not None:
        gate.wait()
    set_thread_worker_info(info)
    put: Callable[[Any], None] = queue.put
    if baton is not None:
        seat = baton.join()

        def put(message: Any) -> None:
            baton.give(seat)  # before a put that may wait: the next worker runs meanwhile
            waits = queue.put_waits
            queue.put(message)
            baton.put_done(waited=queue.put_waits != waits)
            baton.take(seat)

        baton.take(seat)
    if watch_draws:
        put = _first_output_watched(put)
    try:
        if not produce_epoch(pipe, put, epoch=epoch, worker_label=label, resume=resume):
            # The consumer left mid-epoch: close the copy's streams now. It is this
            # thread's alone, and a reference cycle (a block's generator) would keep
            # them open until a garbage collection, or the next epoch.
            release_pipeline(pipe)
    finally:
        if baton is not None:
            baton.give(seat)  # also when the pipeline raised a BaseException while held
        set_thread_worker_info(None)


def _first_output_watched(put: Callable[[Any], None]) -> Callable[[Any], None]:
    """``put`` that warns, at the first output, if a global RNG moved since it was made."""
    check = GlobalDrawCheck(checks=1, message=THREAD_DRAWS)
    check.start()

    def watched(message: Any) -> None:
        if check.left and type(message) is tuple:  # an output (not END or a Failure)
            check.done()
        put(message)

    return watched
