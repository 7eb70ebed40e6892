"""A batch worker process of the economic strategy.

It receives the items of each batch from whichever item workers made them
(``TaskResult`` messages) and, from the main process, each batch's size
(``BatchSize``); once a batch is complete it runs ``batch`` and the per-item
blocks after it (``chain.py``) and sends the batch to the main process.
"""

from __future__ import annotations

from typing import Any

from ....datapipes.runtime import derive_seed, set_output_queue
from ....errors import NotAvailable, QueueError
from ....events import Waiter
from ....queues import ProcessQueue
from ...workers.failure import Failure, unsendable_failure
from ...workers.info import WorkerInfo, set_process_worker_info
from ...workers.messages import BatchResult, BatchSize, EpochStart, Output
from ...workers.process import Payload, bootstrap
from ...workers.rngs import seed_worker_rngs, worker_seed
from .chain import WorkerChain
from .packing import unpack

__all__ = ["batch_worker_main"]

_BATCH_WORKER_TAG = 0xBA7C


def batch_worker_main(
    payload: Payload,
    control: ProcessQueue,
    from_items: list[ProcessQueue],
    to_main: ProcessQueue,
    index: int,
    count: int,
    seed: int,
) -> None:
    """A batch worker: gather each batch's items, batch and collate them."""
    label = bootstrap(f"batch worker {index}")
    set_output_queue(to_main)  # batches are collated into its shared memory
    chain = WorkerChain(payload.load())
    assembler = _BatchAssembler()
    inputs = list(from_items)
    waiter = Waiter()
    for queue in (control, *inputs):
        queue.readiness().attach(waiter)
    while True:
        seen = waiter.generation
        progressed = False
        while True:  # control first: a batch's size may complete it
            try:
                message = control.get(block=False)
            except NotAvailable:
                break
            except QueueError:  # the main process is gone
                return
            progressed = True
            if isinstance(message, EpochStart):
                epoch = message.epoch
                seed_worker_rngs(derive_seed(worker_seed(seed, epoch, index), _BATCH_WORKER_TAG))
                set_process_worker_info(WorkerInfo(index, count, seed, chain.pipe))
                chain.start_epoch(message.gen, epoch, message.stamp_seed)
                assembler.start_epoch(message.gen)
            elif isinstance(message, BatchSize):
                assembler.expect(message.gen, message.unit, message.size)
            else:
                return  # Stop
        for queue in list(inputs):
            while True:
                try:
                    result = queue.get(block=False)
                except NotAvailable:
                    break
                except QueueError:  # that item worker died; the main process raises
                    inputs.remove(queue)
                    break
                progressed = True
                assembler.add(result.gen, result.unit, unpack(result.outputs), result.task_size)
        for gen, unit, entries in assembler.complete():
            outputs = entries if isinstance(entries, Failure) else chain.run(gen, entries, label)
            del entries  # the items' shared memory goes back as soon as the batch is built
            try:
                _send(to_main, BatchResult(gen, unit, outputs), label, chain)
            except QueueError:
                return
            del outputs
        if not progressed:
            waiter.wait(seen)


def _send(to_main: ProcessQueue, result: BatchResult, label: str, chain: WorkerChain) -> None:
    """Send ``result``; an output that cannot cross processes is sent as its failure."""
    try:
        to_main.put(result)
    except QueueError:
        raise
    except Exception as error:  # noqa: BLE001 - an output cannot cross processes
        if isinstance(result.outputs, Failure):
            raise
        failure = unsendable_failure(error, label, repr(chain.pipe), result.outputs)
        to_main.put(result._replace(outputs=failure))


class _BatchAssembler:
    """The items of the batches a batch worker is building, keyed by (gen, unit)."""

    def __init__(self) -> None:
        self._gen = -1
        self._parts: dict[tuple[int, int], list] = {}
        self._counts: dict[tuple[int, int], int] = {}  # items received per batch
        self._sizes: dict[tuple[int, int], int] = {}
        self._failures: dict[tuple[int, int], Failure] = {}
        self._ready: list[tuple[int, int]] = []

    def start_epoch(self, gen: int) -> None:
        self._gen = gen
        for book in (self._parts, self._counts, self._sizes, self._failures):
            for key in [k for k in book if k[0] < gen]:
                del book[key]
        self._ready = [k for k in self._ready if k[0] >= gen]

    def expect(self, gen: int, unit: int, size: int) -> None:
        if gen >= self._gen:
            self._sizes[gen, unit] = size
            self._check((gen, unit))

    def add(self, gen: int, unit: int, result: list[Output] | Failure, count: int) -> None:
        """``result`` of a task of ``count`` items of batch ``unit``."""
        if gen < self._gen:
            return  # an abandoned epoch's items
        key = (gen, unit)
        if isinstance(result, Failure):
            self._failures.setdefault(key, result)
            result = []
        self._parts.setdefault(key, []).append(result)
        self._counts[key] = self._counts.get(key, 0) + count
        self._check(key)

    def _check(self, key: tuple[int, int]) -> None:
        size = self._sizes.get(key)
        if size is not None and self._counts.get(key, 0) == size:
            self._ready.append(key)

    def complete(self) -> list[tuple[int, int, Any]]:
        """The batches whose items all arrived: ``(gen, unit, entries or Failure)``."""
        done: list[tuple[int, int, Any]] = []
        for key in self._ready:
            parts = self._parts.pop(key, [])
            self._counts.pop(key, None)
            del self._sizes[key]
            failure = self._failures.pop(key, None)
            if failure is not None:
                done.append((*key, failure))
            else:
                entries = [entry for part in parts for entry in part]
                entries.sort(key=lambda entry: entry[0])
                done.append((*key, entries))
        self._ready = []
        return done
