"""The processes and queues of the economic and chunked strategies."""

from __future__ import annotations

import multiprocessing.connection
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import NotAvailable, QueueError, WorkerError
from ..events import FdReadiness, ReadinessSource
from ..queues import ProcessQueue
from ._dispatch_workers import batch_worker_main, item_worker_main
from ._process_exit import describe_exit, exit_code, join_or_kill

__all__ = ["DispatchPool"]

# Items in flight on one item worker -> batch worker link. The link's producer
# keeps freed segments for reuse (a fresh segment costs a page fault per 4 KiB,
# ~120 ms per 128 MiB here, more than the copy itself); what it keeps is bounded
# by the items in flight, which the main process bounds by prefetch_factor.
_LINK_CAPACITY = 4


class DispatchPool:
    """Item workers (and batch workers) with their queues to and from the main process.

    Args:
        context: a ``multiprocessing`` context.
        item_payload: the item workers' chain (or its pickle).
        batch_payload: the batch workers' chain (or its pickle); None: no batch workers.
        max_tasks: the most tasks one worker can be given before it answers.
        max_results: the most results a worker can owe the main process.
    """

    def __init__(
        self,
        context: Any,
        *,
        item_payload: Any,
        batch_payload: Any,
        num_item_workers: int,
        num_batch_workers: int,
        max_tasks: int,
        max_results: int,
        seed: int,
        worker_init_fn: Callable[[int], None] | None,
    ) -> None:
        self.num_item_workers = num_item_workers
        self.num_batch_workers = num_batch_workers if batch_payload is not None else 0
        self._tasks = [
            ProcessQueue(max_tasks + 2, owner="producer") for _ in range(num_item_workers)
        ]
        self._item_results = [
            ProcessQueue(max_results + 2, owner="consumer") for _ in range(num_item_workers)
        ]
        self._control = [
            ProcessQueue(max_tasks + 2, owner="producer") for _ in range(self.num_batch_workers)
        ]
        self._batch_results = [
            ProcessQueue(max_results + 2, owner="consumer") for _ in range(self.num_batch_workers)
        ]
        links = [
            [ProcessQueue(_LINK_CAPACITY) for _ in range(self.num_batch_workers)]
            for _ in range(num_item_workers)
        ]
        self._processes: list[tuple[str, Any]] = []
        for j in range(self.num_batch_workers):
            self._start(
                context,
                f"batch worker {j}",
                batch_worker_main,
                (
                    batch_payload,
                    self._control[j],
                    [links[i][j] for i in range(num_item_workers)],
                    self._batch_results[j],
                    j,
                    self.num_batch_workers,
                    seed,
                ),
            )
        for i in range(num_item_workers):
            self._start(
                context,
                f"item worker {i}",
                item_worker_main,
                (
                    item_payload,
                    self._tasks[i],
                    self._item_results[i],
                    links[i],
                    i,
                    num_item_workers,
                    seed,
                    worker_init_fn,
                ),
            )
        for row in links:  # only the workers use these; drop the main process's copies
            for link in row:
                link.close()
        self._results = self._item_results + self._batch_results
        self._finalizer = weakref.finalize(
            self, _stop, self._processes, self._tasks + self._control, self._results
        )

    def _start(self, context: Any, name: str, target: Callable, args: tuple) -> None:
        process = context.Process(
            target=target, args=args, name=f"pipeloom-{name.replace(' ', '-')}", daemon=True
        )
        process.start()
        self._processes.append((name, process))

    # -- talking to the workers ------------------------------------------------
    def start_epoch(self, gen: int, epoch: int, stamp_seed: int | None) -> None:
        message = ("epoch", gen, epoch, stamp_seed)
        for worker in range(self.num_batch_workers):
            self.send_control(worker, message)
        for worker in range(self.num_item_workers):
            self.send_task(worker, message)

    def send_task(self, worker: int, message: tuple) -> None:
        self._send(self._tasks[worker], message)

    def send_control(self, worker: int, message: tuple) -> None:
        self._send(self._control[worker], message)

    def _send(self, queue: ProcessQueue, message: tuple) -> None:
        try:
            try:
                queue.put(message, block=False)
            except NotAvailable:  # tasks of an abandoned epoch still queued: they go fast
                queue.put(message, timeout=60)
        except (QueueError, TimeoutError) as error:
            self.check_alive()
            raise WorkerError(f"a worker stopped taking work: {error}") from error

    def receive(self) -> list[tuple]:
        """Every message the workers sent the main process so far (never waits)."""
        messages = []
        for queue in self._results:
            while True:
                try:
                    messages.append(queue.get(block=False))
                except NotAvailable:
                    break
                except QueueError as error:
                    self.check_alive(wait=5.0)
                    raise WorkerError(f"a worker closed its queue: {error}") from error
        return messages

    def check_alive(self, wait: float = 0.0) -> None:
        """Raise ``WorkerError`` naming a worker that exited (they never exit on their own).

        ``wait``: seconds to give a worker whose queue just broke to be reaped.
        """
        if wait:
            multiprocessing.connection.wait([p.sentinel for _, p in self._processes], wait)
        for name, process in self._processes:
            if exit_code(process) is not None:
                label = f"{name} (pid {process.pid})"
                raise WorkerError(
                    f"{label} {describe_exit(process.exitcode)} before finishing its epoch; "
                    f"if it ran out of memory, lower prefetch_factor",
                    worker=label,
                )

    def readiness(self) -> Sequence[ReadinessSource]:
        return [q.readiness() for q in self._results] + [
            FdReadiness(process.sentinel) for _, process in self._processes
        ]

    def stop(self) -> None:
        self._finalizer()


def _stop(
    processes: list[tuple[str, Any]], senders: list[ProcessQueue], receivers: list[ProcessQueue]
) -> None:
    for queue in senders:
        try:
            queue.put(("stop",), block=False)
        except (NotAvailable, QueueError, RuntimeError):
            pass  # full or broken: the worker is killed below if it does not exit
    for queue in senders + receivers:
        queue.close()
    join_or_kill([process for _, process in processes])
