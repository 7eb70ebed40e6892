"""Chunked's whole batches when the per-item blocks may drop or multiply items.

A tar reader, ``webdataset()``, a ``filter`` or a ``flatmap`` between the
sharding point and ``batch``: nobody knows in advance where a batch starts.
The main process hands out chunks in order, each to the least loaded item
worker, and tells each chunk's worker where the previous chunk went and where
the next one will go (:class:`~...workers.messages.RelayOrder`). The worker:

* runs the per-item blocks on its chunk (at the same time as the others);
* waits for the :class:`~...workers.messages.Relay` of the previous chunk from
  that chunk's worker: the outputs of earlier chunks that do not fill a batch
  yet (none for the epoch's first chunk);
* the relayed outputs followed by its own are, in order, the next outputs of
  the epoch: cut into batches of ``batch_size`` -- the in-process batches, the
  rule classic's workers follow (``classic/assemble.py``) -- it sends what is
  left on to the next chunk's worker at once, then builds and collates the
  batches and sends them to the main process, each with its resume point
  ``(position, outputs of it delivered)``.

The main process only reads whole batches, chunk after chunk. After the last
chunk it sends an empty *final* chunk, whose worker builds the short last
batch (if ``drop_last`` keeps it). A chunk that fails sends a ``stop`` relay,
and so does every later chunk of that epoch, so no worker waits for items
that will not come.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from ....datapipes.runtime import key_position
from ....errors import NotAvailable, QueueError
from ....events import Waiter
from ....queues import ProcessQueue
from ...workers.failure import Failure
from ...workers.messages import EpochStart, Relay, RelayOrder, Stop, Task
from ...workers.rngs import global_rng_states, set_global_rng_states
from .chain import WorkerChain
from .least_loaded import LeastLoaded
from .packing import pack, unpack

__all__ = ["Cut", "RelayEnds", "RelayOrders", "WorkerStopped", "run_relayed"]


class RelayOrders:
    """The main process's side: who relays to whom, chunk after chunk, in one epoch.

    Each chunk goes to the worker chosen for it when the chunk before it went
    out (the first: the least loaded), and names the next chunk's worker (the
    least loaded now). ``skip``: outputs of the first chunk's first position
    delivered before a resume.
    """

    def __init__(self) -> None:
        self.last_worker, self.last_unit = -1, -1
        self.next_worker: int | None = None
        self.skip = 0

    def order(
        self, loads: LeastLoaded, unit: int, amount: int, final: bool
    ) -> tuple[int, RelayOrder]:
        """The worker of chunk ``unit`` (given ``amount`` of work) and its order."""
        if self.next_worker is None:
            worker = loads.assign(amount)
        else:
            worker = self.next_worker
            loads.loads[worker] += amount
        self.next_worker = loads.assign(0)  # the least loaded now
        skip = self.skip if self.last_worker < 0 else 0
        order = RelayOrder(self.last_worker, self.last_unit, self.next_worker, skip, final)
        self.last_worker, self.last_unit = worker, unit
        return worker, order


class WorkerStopped(Exception):
    """The main process asked the worker to exit while it waited for a relay."""


class _EpochOver(Exception):
    """A new epoch started while the worker waited for a relay of the old one."""


class RelayEnds:
    """An item worker's links to every item worker (itself included), both ways.

    ``inbox[v]`` brings relays from worker ``v``; ``outbox[w]`` takes them to
    worker ``w``. While it waits for a relay the worker watches its task queue
    too: tasks that arrive are kept for later (``pending``), a ``Stop`` ends it.
    """

    def __init__(
        self,
        inbox: list[ProcessQueue],
        outbox: list[ProcessQueue],
        tasks: ProcessQueue,
        waiter: Waiter,
    ) -> None:
        self.inbox = inbox
        self.outbox = outbox
        self.tasks = tasks
        self.pending: deque[Any] = deque()
        self.broken: set[int] = set()  # generations a chunk of which failed
        self._held: list[deque[Relay]] = [deque() for _ in inbox]  # read, for a later epoch
        self._waiter = waiter  # the one that watches ``tasks`` (a queue wakes one waiter)
        for link in inbox:
            link.readiness().attach(waiter)

    def send(self, worker: int, relay: Relay) -> None:
        self.outbox[worker].put(relay._replace(items=pack(relay.items, into=self.outbox[worker])))

    def send_stop(self, worker: int, gen: int, unit: int) -> None:
        self.broken.add(gen)
        self.outbox[worker].put(Relay(gen, unit, [], [], stop=True))

    def receive(self, worker: int, gen: int, unit: int) -> Relay:
        """The relay of chunk ``unit`` of epoch ``gen`` from ``worker`` (older ones dropped;
        raises ``_EpochOver`` once that worker or this one moved on to a later epoch)."""
        link, held = self.inbox[worker], self._held[worker]
        while True:
            if held:
                relay = held.popleft()
            else:
                seen = self._waiter.generation
                try:
                    relay = link.get(block=False)
                except NotAvailable:
                    self._watch_tasks(gen)
                    self._waiter.wait(seen)
                    continue
            if relay.gen == gen and relay.unit == unit:
                return relay._replace(items=unpack(relay.items))
            if relay.gen > gen:  # that worker moved on to a later epoch: none will come
                held.appendleft(relay)
                raise _EpochOver

    def _watch_tasks(self, gen: int) -> None:
        """Keep the tasks that arrive; raise when the epoch ``gen`` is over."""
        while True:
            try:
                message = self.tasks.get(block=False)
            except NotAvailable:
                break
            if isinstance(message, Stop):
                raise WorkerStopped
            self.pending.append(message)
        if any(isinstance(m, EpochStart) and m.gen != gen for m in self.pending):
            raise _EpochOver  # its chunks before this one were dropped: no relay comes

    def drop_stale(self, gen: int) -> None:
        """Drop relays of epochs before ``gen`` (an abandoned or failed epoch's last
        chunk's), so none waits in a link; a later epoch's is kept for its chunk.

        A link whose worker is gone (it stopped before this one started: the loader
        closed early on a busy machine; or it died, which the main process reports)
        cannot block anyone: it is left as it is, for :meth:`receive` to raise on."""
        self.broken = {g for g in self.broken if g >= gen}
        for link, held in zip(self.inbox, self._held):
            kept = [relay for relay in held if relay.gen >= gen]
            while True:
                try:
                    relay = link.get(block=False)
                except (NotAvailable, QueueError):
                    break
                if relay.gen >= gen:
                    kept.append(relay)
            held.clear()
            held.extend(kept)

    def reclaim(self) -> None:
        for link in self.outbox:
            link.reclaim()


class Cut:
    """The outputs of the epoch not in a batch yet, each with its resume point."""

    def __init__(self, relay: Relay, skip: int) -> None:
        self.items: list[Any] = list(relay.items)
        self.after: list[tuple[int, int]] = list(relay.after)
        # outputs of the resume position delivered before a resume: the first chunk's,
        # or what earlier chunks left of them (a position's items span chunks)
        self.skip = skip + relay.skip
        self._last, self._count = relay.last  # counted across chunks, as the skip is

    def relay(self, gen: int, unit: int, start: int) -> Relay:
        """The relay of the outputs from ``start`` on to the next chunk's worker."""
        last = (self._last, self._count)
        return Relay(gen, unit, self.items[start:], self.after[start:], last=last, skip=self.skip)

    def add(self, output: Any) -> None:
        position = key_position(output[0])
        assert position is not None
        if position != self._last:
            self._last, self._count = position, 0
        self._count += 1
        if self.skip:
            self.skip -= 1
            return
        self.items.append(output)
        self.after.append((position, self._count))

    def build(
        self, batch_chain: WorkerChain, gen: int, label: str, end: int, batch_size: int
    ) -> list[Any]:
        """Build the batches of the first ``end`` items, dropping each batch's items as
        it is built (a chunk's items and its batches are not all held at once); a
        failure ends the list."""
        batches: list[Any] = []
        made = 0
        try:
            while made < end:
                size = min(batch_size, end - made)
                items, point = self.items[:size], self.after[size - 1]
                del self.items[:size], self.after[:size]
                made += size
                built = batch_chain.run(gen, items, label)
                del items
                if isinstance(built, Failure):
                    return [*batches, built]
                batches += [(key, draws, batch, point) for key, draws, batch in built]
            return batches
        finally:
            del self.items[: end - made], self.after[: end - made]


def run_relayed(
    task: Task,
    chain: WorkerChain,
    batch_chain: WorkerChain,
    batch_size: int,
    ends: RelayEnds,
    label: str,
    send_partial: Callable[[list[Any]], None],
) -> list[Any] | Failure | None:
    """The whole batches chunk ``task`` completes, ``(key, draws, batch, after)`` each,
    then the failure that stopped it if one did (the batches made before an error
    come first, as in-process); None when an earlier chunk failed (nothing to send).

    The epoch's first chunk needs no relay: its batches go out through
    ``send_partial`` as soon as each is full, so the first batch comes sooner."""
    order = task.relay
    assert order is not None
    gen, unit = task.gen, task.unit
    if gen in ends.broken:
        if not order.final:
            ends.send_stop(order.succ, gen, unit)
        if order.pred >= 0:  # its stop: left in the link, a worker's relays fill it and block
            try:
                ends.receive(order.pred, gen, order.pred_unit)
            except _EpochOver:
                pass
        return None
    if order.pred < 0 and not order.final and task.entries:
        return _stream_first(task, chain, batch_chain, batch_size, ends, label, send_partial)
    outputs: list[Any] | Failure = []
    if task.entries:
        outputs = chain.run(gen, task.entries, label)
    failure = outputs if isinstance(outputs, Failure) else None
    if failure is not None:  # the batches its outputs before the error fill come first
        outputs = chain.partial
        chain.partial = []
        if not order.final:
            ends.send_stop(order.succ, gen, unit)
    assert not isinstance(outputs, Failure)
    if order.pred < 0:
        relay = Relay(gen, -1, [], [])
    else:
        try:
            relay = ends.receive(order.pred, gen, order.pred_unit)
        except _EpochOver:
            return None
    if relay.stop:
        if failure is None and not order.final:
            ends.send_stop(order.succ, gen, unit)
        return None
    cut = Cut(relay, order.skip)
    for output in outputs:
        cut.add(output)
    del outputs  # the cut holds them now, and drops each batch's as it builds it
    full = len(cut.items) - len(cut.items) % batch_size
    if order.final:
        full = len(cut.items)
    elif failure is None:  # the next chunk's worker need not wait for these batches
        ends.send(order.succ, cut.relay(gen, unit, full))
    batches = cut.build(batch_chain, gen, label, full, batch_size)
    chain.global_rngs_moved()  # the batch part seeds them per batch
    return batches if failure is None else [*batches, failure]


def _stream_first(
    task: Task,
    chain: WorkerChain,
    batch_chain: WorkerChain,
    batch_size: int,
    ends: RelayEnds,
    label: str,
    send_partial: Callable[[list[Any]], None],
) -> list[Any]:
    """The epoch's first chunk: each batch sent as soon as it is full, then the rest
    relayed; returns the failure that stopped it, if any, as ``run_relayed`` does."""
    order = task.relay
    assert order is not None
    gen, unit = task.gen, task.unit
    cut = Cut(Relay(gen, -1, [], []), order.skip)
    stopped: list[Any] = []

    def each(output: Any) -> bool:
        cut.add(output)
        if len(cut.items) < batch_size:
            return True
        states = global_rng_states()  # the batch part seeds them; the items go on
        batches = cut.build(batch_chain, gen, label, batch_size, batch_size)
        set_global_rng_states(states)
        if batches and isinstance(batches[-1], Failure):
            stopped.append(batches.pop())
        if batches:
            send_partial(batches)
        return not stopped

    failure = chain.run_each(gen, task.entries, label, each)
    chain.global_rngs_moved()
    if stopped or failure is not None:
        ends.send_stop(order.succ, gen, unit)
        return stopped or [failure]
    ends.send(order.succ, cut.relay(gen, unit, 0))
    return []
