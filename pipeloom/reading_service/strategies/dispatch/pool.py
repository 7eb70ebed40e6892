"""The processes and queues of the economic and chunked strategies.

Item workers (and, for economic, batch workers), started, watched and stopped
with ``workers/process.py``; one task queue per item worker, one control
queue per batch worker, a link from every item worker to every batch worker,
and result queues to the main process (sizes in ``planning/planner.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ...._shutdown import Steps, finalize_here, interrupts_held
from ....errors import NotAvailable, QueueError, WorkerError
from ....events import FdReadiness, ReadinessSource, Waiter
from ....queues import ProcessQueue
from ...planning.planner import LINK_CAPACITY
from ...workers.messages import EpochStart, Stop
from ...workers.process import EXIT_GRACE, ExitWatch, Payload, WorkerProcess, stop_processes
from .batch_worker import batch_worker_main
from .item_worker import item_worker_main

__all__ = ["DispatchPool"]

SEND_TIMEOUT = 60.0
"""Seconds to wait for room in a worker's task queue (tasks of an abandoned epoch drain fast)."""


class DispatchPool:
    """Item workers (and batch workers) with their queues to and from the main process.

    Args:
        context: a ``multiprocessing`` context.
        item_payload: the item workers' chain.
        batch_payload: the batch workers' chain; None: no batch workers.
        own_batch_payload: the chain item workers run on a task's outputs, when
            each task is a whole batch they build (economic without batch workers).
        max_tasks: the most tasks one worker can be given before it answers.
        max_results: the most results a worker can owe the main process.
        relay: link every item worker to every item worker (itself included), for
            chunked's relays of the items that do not fill a batch (``relay.py``).
    """

    def __init__(
        self,
        context: Any,
        *,
        item_payload: Payload,
        batch_payload: Payload | None,
        num_item_workers: int,
        own_batch_payload: Payload | None = None,
        num_batch_workers: int,
        max_tasks: int,
        max_results: int,
        seed: int,
        worker_init_fn: Callable[[int], None] | None,
        relay: bool = False,
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
            [ProcessQueue(LINK_CAPACITY) for _ in range(self.num_batch_workers)]
            for _ in range(num_item_workers)
        ]
        relays = [
            [ProcessQueue(LINK_CAPACITY) for _ in range(num_item_workers)]
            for _ in range(num_item_workers if relay else 0)
        ]
        self._workers: list[WorkerProcess] = []
        self._exits = ExitWatch(self._workers)
        starts = [
            (
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
            for j in range(self.num_batch_workers)
        ] + [
            (
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
                    own_batch_payload,
                    ([row[i] for row in relays], relays[i]) if relay else None,
                ),
            )
            for i in range(num_item_workers)
        ]
        self._results = self._item_results + self._batch_results
        self._received: list[Any] = []  # read while waiting to send a task
        # Registered before the first worker starts: a start that fails (Ctrl-C, a fork
        # refused) stops the workers started before it.
        self._finalizer = finalize_here(
            self, _stop, self._workers, self._tasks + self._control, self._results
        )
        try:
            for name, target, args in starts:
                with interrupts_held():  # a started process is listed before Ctrl-C can land
                    self._workers.append(WorkerProcess(context, name, target, args))
        except BaseException:
            self._finalizer()
            raise
        for row in (*links, *relays):  # only the workers use these; drop the main's copies
            for link in row:
                link.close()

    # -- talking to the workers ------------------------------------------------
    def start_epoch(self, gen: int, epoch: int, stamp_seed: int | None) -> None:
        message = EpochStart(gen, epoch, stamp_seed)
        for worker in range(self.num_batch_workers):
            self.send_control(worker, message)
        for worker in range(self.num_item_workers):
            self.send_task(worker, message)

    def send_task(self, worker: int, message: Any) -> None:
        self._send(self._tasks[worker], message)

    def send_control(self, worker: int, message: Any) -> None:
        self._send(self._control[worker], message)

    def _send(self, queue: ProcessQueue, message: Any) -> None:
        try:
            try:
                queue.put(message, block=False)
            except NotAvailable:  # tasks of an abandoned epoch still queued: they go fast
                self._put_receiving(queue, message)
        except (QueueError, TimeoutError) as error:
            self.check_alive()
            raise WorkerError(f"a worker stopped taking work: {error}") from error
        except TypeError as error:  # PayloadError too: what the sharding point yields
            raise type(error)(
                f"the items of the sharding point cross from the main process to the "
                f"workers under this strategy, and one of them cannot: {error}. Shard "
                f"something picklable (file paths, indices) and open or decode after the "
                f"sharding point, or use strategy='classic'"
            ) from error

    def _put_receiving(self, queue: ProcessQueue, message: Any) -> None:
        """Wait for room in ``queue``, reading the workers' results meanwhile (kept for
        :meth:`receive`): a worker blocked on a full queue to the main process (an
        abandoned epoch's batches) takes no task until it has sent them."""
        deadline = time.monotonic() + SEND_TIMEOUT
        waiter = Waiter()
        sources = [queue.space_readiness(), *self.readiness()]
        for source in sources:
            source.attach(waiter)
        try:
            while True:
                seen = waiter.generation
                self._received += self._receive_now()
                try:
                    queue.put(message, block=False)
                    return
                except NotAvailable:
                    pass
                self.check_alive()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"the queue stayed full for {SEND_TIMEOUT:.0f}s (capacity "
                        f"{queue.capacity}); the worker took no task meanwhile"
                    )
                waiter.wait(seen, left)
        finally:
            for source in sources:
                source.detach(waiter)
            waiter.close()

    def receive(self) -> list[Any]:
        """Every message the workers sent the main process so far (never waits)."""
        messages, self._received = self._received, []
        return messages + self._receive_now()

    def _receive_now(self) -> list[Any]:
        messages = []
        for queue in self._results:
            while True:
                try:
                    messages.append(queue.get(block=False))
                except NotAvailable:
                    break
                except QueueError as error:
                    self.check_alive(wait=EXIT_GRACE)
                    raise WorkerError(f"a worker closed its queue: {error}") from error
        return messages

    def check_alive(self, wait: float = 0.0) -> None:
        """Raise ``WorkerError`` naming a worker that exited (they never exit on their own).

        ``wait``: seconds to give a worker whose queue just broke to be reaped.
        """
        if not self._exits.any_exited(wait):
            return
        for worker in self._workers:
            if worker.exit_code() is not None:
                raise worker.died()

    def lost_worker(self) -> bool:
        """Whether a worker died and its death was reported (the pool cannot go on)."""
        return any(w.reported and w.exit_code() is not None for w in self._workers)

    def queues(self) -> list[tuple[str, ProcessQueue]]:
        """The main process's ends: tasks out, results in, labelled."""
        return [
            *((f"tasks -> item worker {i}", q) for i, q in enumerate(self._tasks)),
            *((f"item worker {i} -> main", q) for i, q in enumerate(self._item_results)),
            *((f"control -> batch worker {j}", q) for j, q in enumerate(self._control)),
            *((f"batch worker {j} -> main", q) for j, q in enumerate(self._batch_results)),
        ]

    def readiness(self) -> Sequence[ReadinessSource]:
        return [q.readiness() for q in self._results] + [
            FdReadiness(worker.sentinel) for worker in self._workers
        ]

    def stop(self) -> None:
        self._finalizer()


def _stop(
    workers: list[WorkerProcess], senders: list[ProcessQueue], receivers: list[ProcessQueue]
) -> None:
    with Steps() as steps:
        for queue in senders:
            steps.run(_send_stop, queue)
        for queue in senders + receivers:
            steps.run(queue.close)
        steps.run(stop_processes, workers)


def _send_stop(queue: ProcessQueue) -> None:
    try:
        queue.put(Stop(), block=False)
    except (NotAvailable, QueueError, RuntimeError):
        pass  # full or broken: the worker is killed if it does not exit
