"""Item and batch worker processes of the economic and chunked strategies.

Messages (every one carries the *generation* ``gen`` of the epoch it belongs
to, so output of an abandoned epoch is recognised and dropped):

* main -> item worker ``tasks``: ``("epoch", gen, epoch, stamp_seed)``, then
  ``("task", gen, unit, dest, [(position, value), ...])``; ``("stop",)``.
* item worker -> ``dest`` (a batch worker, or the main process when ``dest``
  is -1): ``(gen, unit, outputs, count)`` with ``outputs`` a list of
  ``(position, draws, item)``, or a ``Failure`` instead of the list, and
  ``count`` the number of items the task had.
* main -> batch worker ``control``: ``("epoch", gen, epoch, stamp_seed)``,
  ``("batch", gen, unit, n)`` once the ``n`` items of ``unit`` are assigned;
  ``("stop",)``.
* batch worker -> main: ``(gen, unit, outputs)`` as above.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import torch

from ..datapipes import (
    BlockingReader,
    DataPipe,
    IterDataPipe,
    MapDataPipe,
    current_position,
    set_pipeline_epoch,
)
from ..datapipes.runtime import (
    current_draws,
    derive_seed,
    forget_lazy_init,
    restart_blocks,
    restore_stamp,
)
from ..errors import NotAvailable, QueueError
from ..events import Waiter
from ..graph import upstream as upstream_blocks
from ..queues import ProcessQueue
from ._failure import Failure, capture_failure
from ._pickling import loads_pipeline
from ._worker_info import WorkerInfo, set_process_worker_info
from ._worker_loop import seed_item_rngs, seed_worker_rngs, worker_seed

__all__ = ["BatchFeed", "TaskFeed", "batch_worker_main", "item_worker_main"]

MAIN = -1  # the ``dest`` of outputs that go straight to the main process
_GLOBAL_RNG_TAG = 0x610B


class TaskFeed(IterDataPipe):
    """Stands in for the sharding root in an item worker: yields one task's values.

    Each value is stamped with its source position, as the root would have.
    With ``source`` (a map-style block the root read by index) the value is
    the index and the item is read here.
    """

    inputs = ("source",)

    def __init__(self, source: MapDataPipe | None = None) -> None:
        self.source = source
        self._entries: list[tuple[int, Any]] = []
        self._next = 0
        self._seed: int | None = None
        self.epoch = 0

    def load(self, entries: list[tuple[int, Any]], seed: int | None) -> None:
        """Yield ``entries`` (``(position, value)`` pairs) next, stamped with ``seed``."""
        self._entries, self._next, self._seed = entries, 0, seed

    def async_next(self) -> Any:
        if self._next >= len(self._entries):
            raise StopIteration
        position, value = self._entries[self._next]
        restore_stamp((self._seed, self.epoch, position, 0))  # before the read: errors name it
        if self._seed is not None:  # global RNG draws depend on the item, not the worker
            seed_item_rngs(derive_seed(self._seed, position, _GLOBAL_RNG_TAG))
        if self.source is None:
            item = value
        else:
            item = self.source.async_get(value)
            restore_stamp((self._seed, self.epoch, position, 0))  # a source may stamp its own
        self._next += 1
        return item

    def __repr__(self) -> str:
        return "TaskFeed()" if self.source is None else f"TaskFeed({self.source!r})"


class BatchFeed(IterDataPipe):
    """Stands in for the item workers in a batch worker: yields one batch's items."""

    inputs = ()

    def __init__(self) -> None:
        self._entries: list[tuple[int, int, Any]] = []
        self._next = 0
        self._seed: int | None = None
        self.epoch = 0

    def load(self, entries: list[tuple[int, int, Any]], seed: int | None) -> None:
        """Yield ``entries`` (``(position, draws, item)``) next, restoring their stamps."""
        self._entries, self._next, self._seed = entries, 0, seed

    def async_next(self) -> Any:
        if self._next >= len(self._entries):
            raise StopIteration
        position, draws, item = self._entries[self._next]
        if self._next == 0 and self._seed is not None:  # as for items: per batch, not worker
            seed_item_rngs(derive_seed(self._seed, position, _GLOBAL_RNG_TAG + 1))
        self._next += 1
        restore_stamp((self._seed, self.epoch, position, draws))
        return item

    def __repr__(self) -> str:
        return "BatchFeed()"


class _Chain:
    """A worker's copy of its part of the pipeline, run once per task."""

    def __init__(self, payload: Any) -> None:
        if isinstance(payload, bytes):
            self.pipe = loads_pipeline(payload)
        else:  # forked: drop what lazy_init did in the parent; it runs again here
            self.pipe = payload
            forget_lazy_init(self.pipe)
        self._blocks: list[DataPipe] = upstream_blocks(self.pipe)
        self.feed = next(b for b in self._blocks if isinstance(b, (TaskFeed, BatchFeed)))
        self._reader = BlockingReader(self.pipe)
        self.epochs: dict[int, tuple[int, int | None]] = {}  # gen -> (epoch, stamp seed)

    def start_epoch(self, gen: int, epoch: int, stamp_seed: int | None) -> None:
        self.epochs = {gen: (epoch, stamp_seed)}
        set_pipeline_epoch(self.pipe, epoch)
        self.feed.epoch = epoch

    def run(self, gen: int, entries: list, label: str) -> list | Failure:
        """Every output of the chain for ``entries``, or the failure it raised."""
        _, stamp_seed = self.epochs[gen]
        try:
            restart_blocks(self._blocks)
            self.feed.load(entries, stamp_seed)
            outputs: list[tuple[int | None, int, Any]] = []
            reader = self._reader
            while True:
                try:
                    item = reader.next()
                except StopIteration:
                    return outputs
                outputs.append((current_position(), current_draws(), item))
        except Exception as error:  # noqa: BLE001 - surfaced in the main process, in order
            return capture_failure(error, label)
        finally:
            self.feed.load([], stamp_seed)  # hold no item past its task


def _start_worker(name: str) -> str:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    restore_stamp((None, 0, None))  # a forked child inherits the parent's item stamp
    torch.set_num_threads(1)  # one intra-op thread per worker, as torch does
    return f"{name} (pid {os.getpid()})"


def item_worker_main(
    payload: Any,
    tasks: ProcessQueue,
    to_main: ProcessQueue,
    to_batch: list[ProcessQueue],
    index: int,
    count: int,
    seed: int,
    worker_init_fn: Callable[[int], None] | None,
) -> None:
    """An item worker: run the per-item blocks for each task it is given."""
    label = _start_worker(f"item worker {index}")
    chain = _Chain(payload)
    initialized = False
    next_task = _TaskWaiter(tasks, to_batch)
    while True:
        try:
            message = next_task()
        except QueueError:  # the main process is gone
            return
        if message[0] == "stop":
            return
        if message[0] == "epoch":
            _, gen, epoch, stamp_seed = message
            own_seed = worker_seed(seed, epoch, index)
            seed_worker_rngs(own_seed)
            set_process_worker_info(WorkerInfo(index, count, own_seed, chain.pipe))
            chain.start_epoch(gen, epoch, stamp_seed)
            if not initialized:
                initialized = True
                if worker_init_fn is not None:
                    failure = _run_init(worker_init_fn, index, label)
                    if failure is not None:
                        to_main.put((gen, None, failure))
                        return
            continue
        _, gen, unit, dest, entries = message
        if gen not in chain.epochs:
            continue  # a task of an abandoned epoch
        result = chain.run(gen, entries, label)
        try:
            (to_main if dest == MAIN else to_batch[dest]).put((gen, unit, result, len(entries)))
        except QueueError:
            if dest == MAIN:
                return
            # the batch worker died; the main process sees it and raises


class _TaskWaiter:
    """Waits for an item worker's next task, giving back freed memory meanwhile.

    A batch worker frees an item's shared memory once the batch is collated;
    the item worker hears of it on its link. Reclaiming while idle (not only
    at the next put on that link, maybe batches later) keeps memory flat.
    """

    def __init__(self, tasks: ProcessQueue, links: list[ProcessQueue]) -> None:
        self.tasks = tasks
        self.links = links
        self.waiter = Waiter()
        tasks.readiness().attach(self.waiter)
        for link in links:
            link.space_readiness().attach(self.waiter)

    def __call__(self) -> Any:
        while True:
            seen = self.waiter.generation
            try:
                return self.tasks.get(block=False)
            except NotAvailable:
                pass
            for link in self.links:
                link.reclaim()
            self.waiter.wait(seen)


def batch_worker_main(
    payload: Any,
    control: ProcessQueue,
    from_items: list[ProcessQueue],
    to_main: ProcessQueue,
    index: int,
    count: int,
    seed: int,
) -> None:
    """A batch worker: gather each batch's items, batch and collate them."""
    label = _start_worker(f"batch worker {index}")
    chain = _Chain(payload)
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
            if message[0] == "stop":
                return
            if message[0] == "epoch":
                _, gen, epoch, stamp_seed = message
                seed_worker_rngs(derive_seed(worker_seed(seed, epoch, index), 0xBA7C))
                set_process_worker_info(WorkerInfo(index, count, seed, chain.pipe))
                chain.start_epoch(gen, epoch, stamp_seed)
                assembler.start_epoch(gen)
            else:
                _, gen, unit, size = message
                assembler.expect(gen, unit, size)
        for queue in list(inputs):
            while True:
                try:
                    gen, unit, result, count = queue.get(block=False)
                except NotAvailable:
                    break
                except QueueError:  # that item worker died; the main process raises
                    inputs.remove(queue)
                    break
                progressed = True
                assembler.add(gen, unit, result, count)
        for gen, unit, entries in assembler.complete():
            result = entries if isinstance(entries, Failure) else chain.run(gen, entries, label)
            del entries  # the items' shared memory goes back as soon as the batch is built
            try:
                to_main.put((gen, unit, result))
            except QueueError:
                return
            del result
        if not progressed:
            waiter.wait(seen)


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

    def add(self, gen: int, unit: int, result: list | Failure, count: int) -> None:
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


def _run_init(worker_init_fn: Callable[[int], None], index: int, label: str) -> Failure | None:
    try:
        worker_init_fn(index)
        return None
    except Exception as error:  # noqa: BLE001 - surfaced in the main process
        return capture_failure(error, f"{label}, in worker_init_fn({index})")
