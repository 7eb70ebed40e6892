"""Warm start: the first outputs from threads of the main process while the worker processes start.

Under spawn or forkserver a worker process makes no output before the
pipeline was pickled and rebuilt in it: hundreds of milliseconds for a
dataset of a few hundred MiB, growing with it. With
``MultiProcessingReadingService(..., warm_start=True)`` a background thread
does that (pickles the pipeline, starts the template, forks the workers)
while the same workers' part runs in threads of the main process (the
runner ``ThreadReadingService`` would build). Between two outputs once the
processes are up, the epoch moves to them from the threads' checkpoint, as
autotune moves a running epoch: no output is repeated or dropped, and the
order is the in-process one. An epoch the threads cannot checkpoint (a block
of the main process's part without ``state_dict()``, ``in_order=False``)
stays in the threads to its end; the next one starts in the processes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

from ...._shutdown import Steps
from ....datapipes import IterDataPipe
from ....errors import StateError
from ....graph import Plan
from ..runner import Runner, close_items, primed
from .runner import ClassicRunner

__all__ = ["WarmStartRunner"]


class WarmStartRunner(Runner):
    """Run epochs in ``threads`` until the runner ``launch()`` builds has its processes up.

    Args:
        pipeline, plan: the pipeline and its plan for worker processes.
        threads: a classic runner over threads of this process (same pipeline).
        launch: builds the classic runner over worker processes and starts
            them (they wait for an epoch); it runs in a background thread
            and must not refer to this runner.
    """

    def __init__(
        self,
        pipeline: IterDataPipe,
        plan: Plan,
        threads: Runner,
        launch: Callable[[], ClassicRunner],
    ) -> None:
        super().__init__(pipeline, plan)
        self._threads: Runner | None = threads
        self._launch = _Launch(launch)
        self._active: Runner = threads

    def start_epoch(self, epoch: int, state: dict[str, Any] | None) -> Iterator[Any]:
        processes = self._launch.ready()
        if processes is not None:
            self._retire_threads()
            self._active = processes
            return processes.start_epoch(epoch, state)
        assert self._threads is not None
        self._active = self._threads
        items = self._threads.start_epoch(epoch, state)
        # Then the launch: its pickling holds the GIL for long stretches, and a thread
        # started meanwhile waits for the GIL before start() returns.
        self._launch.start()
        return primed(self._moving(epoch, items))

    def _moving(self, epoch: int, items: Iterator[Any]) -> Generator[Any, None, None]:
        """The threads' ``items``, then (between two outputs) the processes' rest of the epoch."""
        held = False  # the threads' epoch cannot move: its state cannot be saved
        try:
            yield None  # taken by primed()
            while True:
                if not held and self._active is self._threads and self._launch.done():
                    moved, held = self._move(epoch, items)
                    if moved is not None:
                        items = moved
                try:
                    item = next(items)
                except StopIteration:
                    return
                yield item
        finally:
            close_items(items)

    def _move(self, epoch: int, items: Iterator[Any]) -> tuple[Iterator[Any] | None, bool]:
        """The processes' rest of ``epoch`` from the threads' checkpoint, and whether the
        epoch must stay in the threads to its end (they cannot checkpoint it).

        No rest where the processes cannot resume this output's checkpoint exactly: a
        block after the merge read ahead into a batch the processes would build whole
        (``threadpool_map``, ``prefetch``); the next output may have none begun.
        """
        threads = self._threads
        assert threads is not None
        try:
            state = threads.state_dict()
        except StateError:  # e.g. a block without state_dict(): the next epoch moves
            return None, True
        processes = self._launch.result()  # raises what stopped the launch (a pickling error)
        if not processes.resumes_exactly(state):
            return None, False
        close_items(items)
        self._retire_threads()  # its state (the move's point) stays readable till then
        moved = processes.start_epoch(epoch, state)
        self._active = processes
        return moved, False

    def _retire_threads(self) -> None:
        threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown()

    def state_dict(self) -> dict[str, Any]:
        return self._active.state_dict()

    def shutdown(self) -> None:
        with Steps() as steps:
            if self._threads is not None:
                steps.run(self._threads.shutdown)
            steps.run(self._launch.stop)

    def queues(self) -> Sequence[tuple[str, Any]]:
        return self._active.queues()


class _Launch:
    """The worker processes' start, in a background thread.

    It holds no reference to the runner that owns it (the thread's target
    does, while it runs), so a loader dropped during the start is freed once
    the thread ends, and its workers are stopped by their finalizers.
    """

    def __init__(self, make: Callable[[], ClassicRunner]) -> None:
        self._make: Callable[[], ClassicRunner] | None = make
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._runner: ClassicRunner | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        """Start the background start, once."""
        make, self._make = self._make, None
        if make is not None:
            self._thread = threading.Thread(
                target=self._run, args=(make,), name="pipeloom-warm-start", daemon=True
            )
            self._thread.start()

    def done(self) -> bool:
        return self._done.is_set()

    def ready(self) -> ClassicRunner | None:
        """The processes' runner once started (raising what stopped the start), else None."""
        return self.result() if self._done.is_set() else None

    def result(self) -> ClassicRunner:
        """The processes' runner, waiting for it; raises the error that stopped the start."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._runner is not None
        return self._runner

    def stop(self) -> None:
        """Wait for a start under way, then stop what it started."""
        if self._thread is not None:
            self._thread.join()
        if self._runner is not None:
            self._runner.shutdown()

    def _run(self, make: Callable[[], ClassicRunner]) -> None:
        try:
            self._runner = make()
        except BaseException as error:  # noqa: BLE001 - raised in the consumer's thread
            self._error = error
            if self._runner is not None:
                self._runner.shutdown()
                self._runner = None
        finally:
            self._done.set()
