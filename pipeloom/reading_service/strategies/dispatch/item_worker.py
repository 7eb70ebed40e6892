"""An item worker process of the economic and chunked strategies.

It waits for :class:`~...workers.messages.Task` messages, runs the per-item
blocks on each (``chain.py``) and sends the outputs to the task's batch
worker, or to the main process (chunked).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ....datapipes.runtime import set_output_queue
from ....errors import NotAvailable, QueueError
from ....events import Waiter
from ....queues import ProcessQueue
from ...workers.failure import Failure, capture_failure, unsendable_failure
from ...workers.info import WorkerInfo, set_process_worker_info
from ...workers.messages import MAIN, EpochStart, InitFailed, Task, TaskResult
from ...workers.process import Payload, bootstrap
from ...workers.rngs import seed_worker_rngs, worker_seed
from .chain import WorkerChain
from .packing import pack
from .relay import RelayEnds, WorkerStopped, run_relayed

__all__ = ["item_worker_main"]


def item_worker_main(
    payload: Payload,
    tasks: ProcessQueue,
    to_main: ProcessQueue,
    to_batch: list[ProcessQueue],
    index: int,
    count: int,
    seed: int,
    worker_init_fn: Callable[[int], None] | None,
    batch_payload: Payload | None = None,
    relay_links: tuple[list[ProcessQueue], list[ProcessQueue]] | None = None,
) -> None:
    """An item worker: run the per-item blocks for each task it is given.

    With ``batch_payload`` each task is a whole batch: the worker then runs
    ``batch`` and what follows on the task's outputs, as a batch worker would;
    except a task with ``whole=False`` (a chunk of chunked's first batch, which
    the main process batches), whose items go back as they are. With
    ``relay_links`` (``(inbox, outbox)``, chunked whose per-item blocks are not one
    to one) a task with a ``relay`` order sends the batches its chunk completes
    (``relay.py``).
    """
    label = bootstrap(f"item worker {index}")
    set_output_queue(to_main)  # batches it collates (no batch workers) go there uncopied
    chain = WorkerChain(payload.load())
    batch_chain = None if batch_payload is None else WorkerChain(batch_payload.load())
    initialized = False
    next_task = _TaskWaiter(tasks, to_batch, to_main)
    ends = None if relay_links is None else RelayEnds(*relay_links, tasks, next_task.waiter)
    next_task.relays = ends
    batch_size = 0 if batch_chain is None else batch_chain.batch_size()
    while True:
        try:
            message = next_task()
        except QueueError:  # the main process is gone
            return
        if isinstance(message, EpochStart):
            if ends is not None:
                ends.drop_stale(message.gen)
            own_seed = worker_seed(seed, message.epoch, index)
            seed_worker_rngs(own_seed)
            set_process_worker_info(WorkerInfo(index, count, own_seed, chain.pipe))
            chain.start_epoch(message.gen, message.epoch, message.stamp_seed)
            if batch_chain is not None:
                batch_chain.start_epoch(message.gen, message.epoch, message.stamp_seed)
            if not initialized:
                initialized = True
                if worker_init_fn is not None:
                    failure = _run_init(worker_init_fn, index, label)
                    if failure is not None:
                        to_main.put(InitFailed(message.gen, failure))
                        return
            continue
        if not isinstance(message, Task):
            return  # Stop
        if message.gen not in chain.epochs:
            continue  # a task of an abandoned epoch
        if message.relay is not None:
            assert ends is not None and batch_chain is not None
            try:
                send_partial = functools.partial(
                    _send_partial, to_main, message, label, repr(batch_chain.pipe)
                )
                relayed = run_relayed(
                    message, chain, batch_chain, batch_size, ends, label, send_partial
                )
            except (QueueError, WorkerStopped):  # the main process is gone, or stops us
                return
            if relayed is None:
                continue  # an earlier chunk failed: the main process raises that
            result = TaskResult(message.gen, message.unit, relayed, len(message.entries))
            try:
                _send(to_main, result, label, repr(batch_chain.pipe))
            except QueueError:  # the main process is gone
                return
            del relayed, result
            continue
        outputs = chain.run(message.gen, message.entries, label)
        if batch_chain is not None and message.whole and not isinstance(outputs, Failure):
            outputs = batch_chain.run(message.gen, outputs, label)
            chain.global_rngs_moved()  # the batch part seeds them per batch
        destination = to_main if message.dest == MAIN else to_batch[message.dest]
        result = TaskResult(message.gen, message.unit, outputs, len(message.entries))
        try:
            try:
                result = result._replace(outputs=pack(outputs, into=destination))
                destination.put(result)
            except QueueError:
                raise
            except Exception as error:  # noqa: BLE001 - an output cannot cross processes
                if isinstance(outputs, Failure):
                    raise
                failure = unsendable_failure(error, label, repr(chain.pipe), outputs)
                destination.put(result._replace(outputs=failure))
        except QueueError:
            if message.dest == MAIN:
                return
            # the batch worker died; the main process sees it and raises
        # Drop the outputs before waiting: a batch built in the queue's shared memory
        # is freed for reuse only once this process holds it no longer either.
        del outputs, result


class _TaskWaiter:
    """Waits for an item worker's next task, giving back freed memory meanwhile.

    A batch worker frees an item's shared memory once the batch is collated;
    the item worker hears of it on its link. Reclaiming while idle (not only
    at the next put on that link, maybe batches later) keeps memory flat.
    """

    def __init__(
        self, tasks: ProcessQueue, links: list[ProcessQueue], to_main: ProcessQueue
    ) -> None:
        self.tasks = tasks
        self.links = links
        self.to_main = to_main
        self.relays: RelayEnds | None = None  # tasks read while waiting for a relay: first
        self.waiter = Waiter()
        tasks.readiness().attach(self.waiter)
        for link in (*links, to_main):  # the consumers' frees, to give memory back at once
            link.space_readiness().attach(self.waiter)

    def __call__(self) -> Any:
        if self.relays is not None and self.relays.pending:
            return self.relays.pending.popleft()
        while True:
            seen = self.waiter.generation
            try:
                return self.tasks.get(block=False)
            except NotAvailable:
                pass
            for link in self.links:
                link.reclaim()
            if self.relays is not None:
                self.relays.reclaim()
            # Many item workers, few batches in flight: an idle worker keeps no big
            # segment, so memory stays flat in num_workers (small ones stay pooled).
            self.to_main.trim()
            self.waiter.wait(seen)


def _run_init(worker_init_fn: Callable[[int], None], index: int, label: str) -> Failure | None:
    try:
        worker_init_fn(index)
        return None
    except Exception as error:  # noqa: BLE001 - surfaced in the main process
        return capture_failure(error, f"{label}, in worker_init_fn({index})")


def _send_partial(
    to_main: ProcessQueue, task: Task, label: str, block: str, batches: list[Any]
) -> None:
    """Send some of a chunk's batches ahead of the rest."""
    _send(to_main, TaskResult(task.gen, task.unit, batches, 0, partial=True), label, block)


def _send(to_main: ProcessQueue, result: TaskResult, label: str, block: str) -> None:
    """Put a chunk's whole batches; a batch that cannot cross is reported as its failure."""
    try:
        to_main.put(result)
    except QueueError:
        raise
    except Exception as error:  # noqa: BLE001 - a batch cannot cross processes
        outputs = result.outputs
        if isinstance(outputs, Failure):
            raise
        failure = unsendable_failure(error, label, block, [o[:3] for o in outputs])
        to_main.put(result._replace(outputs=failure))
