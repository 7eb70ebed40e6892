"""The main process's side of the economic and chunked strategies.

:class:`Dispatcher` reads the sharding point in the main process, gives each
item (economic) or each run of ``chunk_size`` items (chunked) to the least
loaded item worker, each batch (economic) to the least loaded batch worker
(``least_loaded.py``), and keeps at most ``max_units`` batches or chunks in
flight. It yields the workers' outputs in source order, so the result is the
in-process result.

Chunked with whole batches (``first_unit_chunk``): the first batch of an
epoch goes out as chunks to several item workers, which send back items; the
dispatcher batches them itself (``batch_chain``, e.g. ``batch`` + ``collate``),
so the first batch comes sooner. Every later batch is one task for one item
worker, which builds and collates it.

Chunked with relayed chunks (``relayed``): item workers build the batches
their chunks complete (``relay.py``); the results are whole batches, each
with the point a resume after it starts from.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from ....datapipes import IterDataPipe, StateFields
from ....datapipes.runtime import RunReader, current_stamp, key_position, restore_stamp
from ....errors import NotAvailable
from ....events import ReadinessSource
from ....graph import upstream
from ...workers.failure import Failure, noted_origin
from ...workers.messages import MAIN, BatchSize, InitFailed, Output, Task
from ...workers.rngs import global_rng_states, set_global_rng_states
from .budget import ChunkBudget
from .chain import WorkerChain
from .least_loaded import LeastLoaded
from .packing import unpack
from .relay import RelayOrders
from .resume_point import ResumePoint
from .units import Unit, WorkerPool

__all__ = ["Dispatcher", "WorkerPool"]


class Dispatcher(IterDataPipe):
    """Hands out the source's items and yields the workers' outputs in order.

    Args:
        unit_size: items per batch (economic) or per chunk (chunked).
        max_units: batches or chunks in flight at most.
        per_item_tasks: send each item as its own task to the least loaded
            item worker (economic); otherwise a whole unit is one task.
        units_are_batches: a unit is a whole batch (economic), so the part of one
            that the source made before an error is dropped, as ``batch`` drops
            it in-process; otherwise (chunks) it goes out, and ``batch`` in the
            main process sees the error after its items.
        first_unit_chunk: hand out the first batch of an epoch in chunks of
            this many items, whose items ``batch_chain`` (``batch`` and the
            per-item blocks after it, fed by a ``BatchFeed``) batches here.
        batch_chain: see ``first_unit_chunk``.
        relayed: chunks whose workers build the batches they complete (module docstring).
        batches_ahead: relayed: the batches the chunks in flight should make (``budget.py``).

    An error of the source is raised after the outputs of every unit read
    before it, as in-process: the batches made before it all arrive first.
    """

    inputs = ()  # the source is attached per epoch: it runs beside the main part, not in it
    restartable = False  # its stream is produced once per epoch

    def __init__(
        self,
        *,
        unit_size: int,
        max_units: int,
        per_item_tasks: bool,
        units_are_batches: bool,
        first_unit_chunk: int | None = None,
        batch_chain: IterDataPipe | None = None,
        relayed: bool = False,
        batches_ahead: int | None = None,
    ) -> None:
        if (first_unit_chunk is None) != (batch_chain is None):
            raise ValueError(
                f"first_unit_chunk and batch_chain go together (the chain batches the chunks), "
                f"got first_unit_chunk={first_unit_chunk!r} and batch_chain={batch_chain!r}"
            )
        self.unit_size = unit_size
        self.max_units = max_units
        self.per_item_tasks = per_item_tasks
        self.units_are_batches = units_are_batches
        self.first_unit_chunk = first_unit_chunk
        self.relayed = relayed
        self._budget = ChunkBudget(max_units=max_units, batches_ahead=batches_ahead)
        self._batch_chain = None if batch_chain is None else WorkerChain(batch_chain)
        self._source: IterDataPipe | None = None
        self._pool: WorkerPool | None = None
        self._gen = 0
        self._stamp: tuple[int | None, int] = (None, 0)
        self.reset()

    # -- epochs ----------------------------------------------------------------
    def attach(
        self, source: IterDataPipe, pool: WorkerPool, *, gen: int, seed: int | None, epoch: int
    ) -> None:
        """Read this epoch's items from ``source`` and have ``pool`` work on them."""
        self._source, self._pool, self._gen = source, pool, gen
        self._runs = RunReader(source)
        self._stamp = (seed, epoch)
        if self._batch_chain is not None:
            self._batch_chain.start_epoch(gen, epoch, seed)
        # Economic hands a slice of a run to each item worker: a few per unit, not one per item.
        self._piece = max(1, -(-self.unit_size // max(1, pool.num_item_workers)))
        self._item_workers = LeastLoaded(pool.num_item_workers)
        self._batch_workers = LeastLoaded(max(1, pool.num_batch_workers))
        self._budget.workers = pool.num_item_workers

    def reset(self) -> None:
        self.in_flight: deque[Unit] = deque()  # batches or chunks sent, not yet delivered
        self._open: Unit | None = None
        self._pending_chunk: list[tuple[int, Any]] = []
        self._assigned: dict[int, list[tuple[int, Any]]] = {}  # worker -> open unit's items
        self._results: dict[int, Any] = {}
        self._partials: dict[int, list[Any]] = {}  # relayed: batches sent ahead of the rest
        self._outputs: deque[tuple[int, int, Any]] = deque()
        self._batches: deque[Any] = deque()  # relayed: (key, draws, batch, after) or a Failure
        self._next_id = 0
        self._source_done = False
        self._count = 0  # items read from the source (the position when it stamps none)
        self._point = ResumePoint()  # after the last finished unit, or the last output
        self._fill_error: Exception | None = None  # met by _fill_ahead, raised by _fill
        self._source_error: Exception | None = None  # raised once the units before it are out
        # The first batch in chunks: items to read, all sent, items taken, the position after.
        self._split_left = self.unit_size if self.first_unit_chunk else 0
        self._split_closed = False
        self._split: list[Output] = []
        self._split_start: tuple[int, int] | None = None
        self._split_end = (0, 0, 0)
        self._relays = RelayOrders()
        if self._pool is not None:
            self._item_workers = LeastLoaded(self._pool.num_item_workers)
            self._batch_workers = LeastLoaded(max(1, self._pool.num_batch_workers))

    def readiness_sources(self) -> Sequence[ReadinessSource]:
        sources = list(self._pool.readiness()) if self._pool is not None else []
        if self._source is not None:
            sources += [s for b in upstream(self._source) for s in b.readiness_sources()]
        return sources

    # -- delivering ------------------------------------------------------------
    def async_next(self) -> Any:
        while True:
            if self._batches:  # relayed: whole batches, each with its resume point
                batch = self._batches.popleft()
                if isinstance(batch, Failure):  # after the batches made before it
                    batch.raise_here()
                key, draws, item, after = batch
                self._point.relayed(after)
                restore_stamp((self._stamp[0], self._stamp[1], key, draws))
                return item
            if self._outputs:
                key, draws, item = self._outputs.popleft()
                skipped = self._point.deliver(key)
                if not self._outputs:
                    self._point.unit_done()
                if skipped:
                    continue
                restore_stamp((self._stamp[0], self._stamp[1], key, draws))
                return item
            self._fill()
            if self._split_closed and not any(unit.chunk for unit in self.in_flight):
                self._finish_split()
                continue
            if not self.in_flight:
                if self._source_error is not None:
                    raise self._source_error
                if self._source_done:
                    raise StopIteration
                raise NotAvailable
            self._take_finished_unit()
            self._fill_ahead()

    def async_next_many(self, limit: int) -> list[Any]:
        """Up to ``limit`` outputs at once (``batch`` takes runs): no call per output."""
        items: list[Any] = []
        while len(items) < limit:
            if self._point.skipping or not self._outputs:  # one by one; ends when none is ready
                try:
                    items.append(self.async_next())
                except (NotAvailable, StopIteration):
                    if not items:
                        raise
                    break
                continue
            outputs = self._outputs
            taken = [outputs.popleft() for _ in range(min(limit - len(items), len(outputs)))]
            items += [item for _, _, item in taken]
            key, draws, _ = taken[-1]
            self._point.deliver_run([key for key, _, _ in taken])
            if not outputs:
                self._point.unit_done()
            restore_stamp((self._stamp[0], self._stamp[1], key, draws))
        return items

    def _take_finished_unit(self) -> None:
        assert self._pool is not None
        head = self.in_flight[0]
        if head.id not in self._results:
            self._receive()
        if head.id in self._partials:  # relayed: the first chunk's batches, each when made
            partial = self._partials.pop(head.id)
            self._batches.extend(partial)
            self._budget.record(batches=len(partial), chunks=0)
            if head.id not in self._results:
                return
        if head.id not in self._results:
            self._pool.check_alive()
            raise NotAvailable
        result = self._results.pop(head.id)
        if isinstance(result, Failure):
            result.raise_here()
        self.in_flight.popleft()
        for worker, amount in head.item_workers:
            self._item_workers.done(worker, amount)
        if head.batch_worker != MAIN:
            self._batch_workers.done(head.batch_worker)
        if self.relayed:  # whole batches; a resume starts after the last one delivered
            self._batches.extend(result)
            self._budget.record(batches=len(result), chunks=1)
            return  # a failure among them raises when it is reached
        if head.chunk:  # its items wait for the rest of the first batch
            self._split.extend(result)
            if self._split_start is None:
                self._split_start = head.start
            self._split_end = head.end
            return
        self._deliver(result, head.start, head.end)

    def _deliver(self, outputs: list[Any], start: tuple[int, int], end: tuple) -> None:
        """Queue the ``outputs`` of the unit from ``start`` (``(position, items of it
        before)``) to ``end``, the resume point once they are all delivered."""
        self._outputs.extend(outputs)
        self._point.unit(start, end, len(outputs))

    def _finish_split(self) -> None:
        """Batch the first batch's items (all its chunks are in) here, as a worker would."""
        chain = self._batch_chain
        assert chain is not None
        entries, self._split, self._split_closed = self._split, [], False
        start, self._split_start = self._split_start, None
        if not entries or start is None:  # the source ended at the first chunk's start
            return
        states = global_rng_states()  # the chain seeds them per batch; keep the caller's
        try:
            outputs = chain.run(self._gen, entries, "main process")
        finally:
            set_global_rng_states(states)
        if isinstance(outputs, Failure):
            outputs.raise_here()
        else:
            self._deliver(outputs, start, self._split_end)

    def _receive(self) -> None:
        assert self._pool is not None
        for message in self._pool.receive():
            if message.gen != self._gen:
                continue  # an abandoned epoch's output
            if isinstance(message, InitFailed):
                message.failure.raise_here()
            if getattr(message, "partial", False):  # relayed: batches ahead of the rest
                outputs = message.outputs
                part = outputs if isinstance(outputs, list) else [outputs]
                self._partials.setdefault(message.unit, []).extend(part)
                continue
            self._results[message.unit] = unpack(message.outputs)

    # -- handing out ------------------------------------------------------------
    def _fill_ahead(self) -> None:
        """``_fill`` as soon as a unit is taken, so the worker that made it does not wait
        for the consumer's next call; an error of the source waits for that call."""
        try:
            self._fill()
        except Exception as error:  # noqa: BLE001 - raised by the next _fill, in order
            self._fill_error = error

    def _fill(self) -> None:
        """Give workers items while fewer than ``max_units`` units are in flight."""
        if self._fill_error is not None:
            error, self._fill_error = self._fill_error, None
            raise error
        try:
            self._read_source()
        finally:
            if self._open is not None:  # what was assigned goes out now: workers start at once
                self._flush(self._open)

    def _read_source(self) -> None:
        source = self._source
        assert source is not None
        while not self._source_done:
            unit = self._open
            if unit is None:
                if not self._split_left and self._batches_in_flight() >= self._budget.limit():
                    return
                unit = self._open = self._new_unit()
            try:
                run = None
                if not self._point.dropping:  # else item by item, to drop those taken
                    run = self._runs.positioned(unit.size - len(unit.positions))
                if run is None:
                    value = source.async_next()
            except NotAvailable:
                return
            except StopIteration:
                self._source_done = True
                self._point.ended()  # a resume point past the data's end raises
                self._close(unit)
                if self.relayed:
                    self._close(self._new_unit(final=True))
                return
            except Exception as error:  # noqa: BLE001 - raised after the units before it
                self._source_done, self._source_error = True, noted_origin(error)
                if self.units_are_batches:
                    self._abandon(unit)
                else:
                    self._close(unit)
                return
            if run is not None:  # a slice of a sequence: no call per item
                self._count += len(run[1])
                self._add_run(unit, *run)
                if len(unit.positions) == unit.size:
                    self._close(unit)
                continue
            key = current_stamp()[2]  # p, or (p, j, ...) from a point that keys its outputs
            if key is None:
                key = self._count
            self._count += 1
            if (key.__class__ is tuple or self._point.dropping) and not self._point.read(key):
                continue  # taken before the resume
            self._add(unit, key, value)
            if len(unit.positions) == unit.size:
                self._close(unit)

    def _batches_in_flight(self) -> int:
        """Units in flight, the first batch's chunks counted as one batch."""
        chunks = sum(unit.chunk for unit in self.in_flight)
        return len(self.in_flight) - chunks + (1 if chunks or self._split else 0)

    def _new_unit(self, *, final: bool = False) -> Unit:
        assert self._pool is not None
        batch_worker = MAIN
        if self._pool.num_batch_workers:
            batch_worker = self._batch_workers.assign()
        size, chunk = self.unit_size, False
        if self._split_left:  # a chunk of the first batch
            assert self.first_unit_chunk is not None
            size, chunk = min(self.first_unit_chunk, self._split_left), True
            self._split_left -= size
        unit = Unit(self._next_id, batch_worker, size, chunk, final)
        self._next_id += 1
        self.in_flight.append(unit)
        return unit

    def _add(self, unit: Unit, key: Any, value: Any) -> None:
        assert self._pool is not None
        position = key_position(key)
        assert position is not None  # _read_source numbers unstamped items
        if not unit.positions:
            unit.start = self._point.before(key)
        unit.positions.append(position)
        if not self.per_item_tasks:
            self._pending_chunk.append((key, value))
            return
        worker = self._item_workers.assign()
        unit.item_workers.append((worker, 1))
        self._assigned.setdefault(worker, []).append((key, value))

    def _add_run(self, unit: Unit, positions: range, values: list[Any]) -> None:
        """``_add`` for a run of items: economic gives each least loaded worker a slice."""
        if not unit.positions:
            unit.start = (positions[0], 0)
        unit.positions.extend(positions)
        entries = list(zip(positions, values))
        if not self.per_item_tasks:
            self._pending_chunk.extend(entries)
            return
        piece = self._piece
        for start in range(0, len(entries), piece):
            part = entries[start : start + piece]
            worker = self._item_workers.assign(len(part))
            unit.item_workers.append((worker, len(part)))
            self._assigned.setdefault(worker, []).extend(part)

    def _flush(self, unit: Unit) -> None:
        """Send each item worker the items of ``unit`` assigned to it, as one task."""
        assert self._pool is not None
        for worker, entries in self._assigned.items():
            self._pool.send_task(worker, Task(self._gen, unit.id, unit.batch_worker, entries))
        self._assigned = {}

    def _close(self, unit: Unit) -> None:
        assert self._pool is not None
        self._open = None
        if unit.positions:  # nothing was read since its last item
            unit.end = self._point.after(unit.positions[-1])
        if unit.chunk and (not self._split_left or self._source_done):
            self._split_closed = True  # the first batch's last chunk
        if not unit.positions and not unit.final:  # the source ended at a unit boundary
            self.in_flight.remove(unit)
            if unit.batch_worker != MAIN:
                self._batch_workers.done(unit.batch_worker)
            return
        if self.per_item_tasks:
            self._flush(unit)
            self._pool.send_control(
                unit.batch_worker, BatchSize(self._gen, unit.id, len(unit.positions))
            )
            return
        if self.relayed:
            self._send_relayed(unit)
            return
        worker = self._item_workers.assign(len(unit.positions))
        unit.item_workers.append((worker, len(unit.positions)))
        chunk, self._pending_chunk = self._pending_chunk, []
        self._pool.send_task(worker, Task(self._gen, unit.id, MAIN, chunk, not unit.chunk))

    def _send_relayed(self, unit: Unit) -> None:
        """Send a chunk to the worker chosen for it, naming the next chunk's worker."""
        assert self._pool is not None
        amount = max(1, len(unit.positions))
        worker, order = self._relays.order(self._item_workers, unit.id, amount, unit.final)
        unit.item_workers.append((worker, amount))
        chunk, self._pending_chunk = self._pending_chunk, []
        self._pool.send_task(worker, Task(self._gen, unit.id, MAIN, chunk, True, order))

    def _abandon(self, unit: Unit) -> None:
        """Drop the open ``unit``: a batch the source failed to finish (its items
        already sent are dropped by the workers when the next epoch starts)."""
        self._open = None
        self._assigned, self._pending_chunk = {}, []
        self.in_flight.remove(unit)
        for worker, amount in unit.item_workers:
            self._item_workers.done(worker, amount)
        if unit.batch_worker != MAIN:
            self._batch_workers.done(unit.batch_worker)

    # -- checkpoints -------------------------------------------------------------
    @property
    def resume_from(self) -> tuple[int, int, int]:
        """``(position, taken, delivered)`` where a resumed epoch starts (``resume_point.py``)."""
        return self._point.point

    def resume(self, position: int, taken: int, delivered: int) -> None:
        """Start where :attr:`resume_from` said (after ``reset``, before reading)."""
        self._point.resume(position, taken, delivered, here=not self.relayed)
        if self.relayed:  # the first chunk's worker drops them
            self._relays.skip = delivered

    def state_dict(self) -> dict[str, Any]:
        position, taken, delivered = self._point.point
        return {"position": position, "taken": taken, "delivered_here": delivered}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        position, delivered = fields.int("position"), fields.int("delivered_here")
        self.resume(position, fields.int("taken", default=0), delivered)  # 0: an older state

    def __repr__(self) -> str:
        kind = "items" if self.per_item_tasks else "chunks"
        return f"Dispatcher({kind}, unit_size={self.unit_size}, max_units={self.max_units})"
