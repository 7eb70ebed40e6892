"""Whole batches from workers whose per-item blocks may drop or multiply items.

When the blocks between the sharding point and ``batch`` are not one to one
(a file opener that skips, a tar reader, ``webdataset``, ``filter``,
``flatmap``), nobody knows in advance where a batch starts. The workers find
out together, without the main process:

* positions go out in *runs* of ``run_size`` (run ``i`` is positions
  ``[i * run_size, (i + 1) * run_size)``, made by worker ``i % n``);
* a worker makes every output of its run, then waits for the run's *baton*
  from the worker of run ``i - 1``: the outputs of earlier runs that do not
  fill a batch yet (fewer than ``batch_size``, with their item stamps);
* baton items followed by the run's outputs are, in order, the next outputs
  of the epoch: cut into batches of ``batch_size`` -- the in-process batches
  -- they are built and collated here; what is left is the next run's baton,
  sent on at once (so the next worker does not wait for the collation).

The main process reads whole batches, one message each, and one
:class:`~...workers.messages.RunDone` per run (see ``batch_merge.py``). Each
batch says where a resume after it starts: ``(position, skip)``, the
position of its last item and how many outputs of that position it and the
batches before it hold. The baton also counts runs in a row whose worker had
no outputs left (at ``n`` every worker is done: its holder sends the short
last batch and the baton goes round once more to end the epoch), and a
``stop`` baton goes round when a worker failed or the epoch was abandoned,
so no worker waits for a baton that will not come.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ....datapipes import (
    BlockingReader,
    DataPipe,
    IterDataPipe,
    reset_pipeline,
    set_pipeline_epoch,
)
from ....datapipes.runtime import current_stamp, key_position, restore_stamp
from ....errors import NotAvailable, QueueError
from ....graph import upstream
from ...workers.epoch import EpochCancelled, send_end, send_failure
from ...workers.failure import unsendable_failure
from ...workers.messages import RunDone

__all__ = ["Baton", "BatchChain", "LocalRing", "Ring", "produce_assembled_epoch"]


class Baton(NamedTuple):
    """What the worker of run ``run`` waits for (see the module docstring)."""

    generation: int
    run: int
    items: list  # (stamp, item, resume point after it) of outputs not in a batch yet
    skip: int  # outputs of the run's first position delivered before a resume
    idle: int  # runs in a row whose worker had no outputs left
    kind: str = "run"  # "run", "finished" (the epoch is over) or "stop"


class _RingStopped(Exception):
    """Another worker failed or the epoch was abandoned."""


class _Reported(Exception):
    """This worker's failure was sent already."""


class Ring:
    """A worker's two ends of the ring: its inbox, and the next worker's."""

    def __init__(self, inbox: Any, outbox: Any) -> None:
        self.inbox = inbox
        self.outbox = outbox

    def send(self, baton: Baton) -> None:
        self.outbox.put(baton)

    def send_stop(self, generation: int) -> None:
        try:
            self.outbox.put(Baton(generation, -1, [], 0, 0, "stop"), block=False)
        except (NotAvailable, QueueError):
            pass  # full (the next worker has a baton to read first) or gone

    def receive(self, generation: int) -> Baton:
        while True:
            baton = self.inbox.get()
            if baton.generation == generation:  # older ones: an abandoned epoch's
                return baton


class LocalRing(Ring):
    """The ring of a single worker: it passes the baton to itself."""

    def __init__(self) -> None:
        self._held: list[Baton] = []

    def send(self, baton: Baton) -> None:
        self._held.append(baton)

    def send_stop(self, generation: int) -> None:
        self._held.clear()

    def receive(self, generation: int) -> Baton:
        return self._held.pop(0)


class BatchChain:
    """A worker's copy of the workers' part, split at ``batch``: items, then batches.

    ``item_exit`` yields the outputs of the worker's runs; ``exit`` builds one
    batch (and collates it) from the items given to :meth:`build`.
    """

    def __init__(self, exit: IterDataPipe) -> None:
        chain = upstream(exit)
        batcher = next(b for b in chain if b.batches_of() is not None)
        (item_exit,) = batcher.parents
        assert isinstance(item_exit, IterDataPipe)
        self.exit = exit
        self.item_exit = item_exit
        self.feed = _Feed()
        batcher.replace_parent(item_exit, self.feed)
        self.batch_size: int = batcher.batches_of()  # type: ignore[assignment]

    def start(self, epoch: int) -> None:
        for part in (self.item_exit, self.exit):
            set_pipeline_epoch(part, epoch)
            reset_pipeline(part)
        self._batches = BlockingReader(self.exit)

    def build(self, items: list) -> tuple[Any, Any] | None:
        """The batch of ``items`` (``(stamp, item, ...)``) and its stamp; None if dropped."""
        self.feed.items = items
        self.feed.next = 0
        try:
            batch = self._batches.next()
        except StopIteration:  # a short last batch with drop_last
            return None
        return current_stamp(), batch


class _Feed(IterDataPipe):
    """Yields the items of one batch, each with its own stamp, then stops."""

    inputs = ()

    def __init__(self) -> None:
        self.items: list = []
        self.next = 0

    def async_next(self) -> Any:
        if self.next >= len(self.items):
            raise StopIteration
        stamp, item = self.items[self.next][:2]
        self.next += 1
        restore_stamp(stamp)
        return item


def produce_assembled_epoch(
    chain: BatchChain,
    point: DataPipe,
    put: Callable[[Any], None],
    ring: Ring,
    *,
    epoch: int,
    generation: int,
    index: int,
    count: int,
    run_size: int,
    worker_label: str,
    resume: tuple[int, int] | None = None,
) -> bool:
    """Send this worker's whole batches of ``epoch`` and a ``RunDone`` per run, then ``END``.

    ``resume=(position, skip)`` starts after a checkpoint. Returns False when
    the consumer is gone for good, True otherwise (as ``produce_epoch``).
    """
    restore_stamp((None, epoch, None))
    try:
        chain.start(epoch)
        start = 0
        if resume is not None:
            start = resume[0]
            point.resume_at(start)
        assembler = _Assembler(chain, put, ring, generation, index, count, run_size, start, resume)
        assembler.label = worker_label
        assembler.assemble()
    except _Reported:
        ring.send_stop(generation)
        return True
    except (EpochCancelled, _RingStopped):
        ring.send_stop(generation)
        return send_end(put)
    except QueueError:
        ring.send_stop(generation)
        return False
    except BaseException as error:  # noqa: BLE001 - every failure goes to the consumer
        ring.send_stop(generation)
        return send_failure(put, error, worker_label)
    return send_end(put)


class _Assembler:
    """One worker's epoch of runs (see the module docstring)."""

    def __init__(
        self,
        chain: BatchChain,
        put: Callable[[Any], None],
        ring: Ring,
        generation: int,
        index: int,
        count: int,
        run_size: int,
        start: int,
        resume: tuple[int, int] | None,
    ) -> None:
        self.chain, self.put, self.ring = chain, put, ring
        self.generation, self.index, self.count, self.run_size = generation, index, count, run_size
        first_run = start // run_size
        self.first_run = first_run
        # this worker's first run at or after first_run
        self.current = first_run + (index - first_run) % count
        self.resume_skip = 0 if resume is None else resume[1]
        self.label = ""
        self.last_position = -1
        self.index_at_position = 0

    def assemble(self) -> None:
        reader = BlockingReader(self.chain.item_exit)
        outputs: list = []
        while True:
            try:
                item = reader.next()
            except StopIteration:
                break
            except (EpochCancelled, QueueError):
                raise
            except Exception:
                self._finish_before_error(outputs)
                raise
            stamp = current_stamp()
            position = key_position(stamp[2])
            assert position is not None
            while position // self.run_size > self.current:
                self._finish_run(outputs, exhausted=False)
                outputs = []
            outputs.append((stamp, item, position))
        more = self._finish_run(outputs, exhausted=True)
        while more:  # relay the baton through runs this worker has no outputs in
            more = self._finish_run([], exhausted=True)

    def _finish_before_error(self, outputs: list) -> None:
        """Send the whole batches made of the outputs before an error, as in-process: the
        runs before the failing item's, then its run's full batches (the error follows)."""
        failed = key_position(current_stamp()[2])
        while failed is not None and failed // self.run_size > self.current:
            if not self._finish_run(outputs, exhausted=False):
                return
            outputs = []
        baton = self._receive()
        if baton.kind == "finished":
            return
        pending = self._pending(baton, outputs)
        batch_size = self.chain.batch_size
        for first in range(0, len(pending) - len(pending) % batch_size, batch_size):
            self._send(pending[first : first + batch_size])

    def _receive(self) -> Baton:
        if self.current == self.first_run:
            return Baton(self.generation, self.current, [], self.resume_skip, 0)
        baton = self.ring.receive(self.generation)
        if baton.kind == "stop":
            raise _RingStopped
        return baton

    def _finish_run(self, outputs: list, *, exhausted: bool) -> bool:
        """Cut run ``self.current`` into batches; False once the epoch is over."""
        baton = self._receive()
        if baton.kind == "finished":
            if baton.idle > 1:
                self.ring.send(baton._replace(idle=baton.idle - 1))
            return False
        pending = self._pending(baton, outputs)
        batch_size = self.chain.batch_size
        full = len(pending) - len(pending) % batch_size
        idle = baton.idle + 1 if exhausted and not outputs else 0
        done = idle >= self.count
        if not done:
            rest = pending[full:]
            self.ring.send(Baton(self.generation, self.current + 1, rest, 0, idle))
        for first in range(0, full, batch_size):
            self._send(pending[first : first + batch_size])
        if done and full < len(pending):
            self._send(pending[full:])
        if done and self.count > 1:
            self.ring.send(Baton(self.generation, -1, [], 0, self.count - 1, "finished"))
        self.put(RunDone(self.current, done))
        self.current += self.count
        return not done

    def _pending(self, baton: Baton, outputs: list) -> list:
        """The baton's items then the run's ``outputs``: ``(stamp, item, resume point)``."""
        pending: list = list(baton.items)
        skip = baton.skip
        for stamp, item, position in outputs:
            if position != self.last_position:
                self.last_position, self.index_at_position = position, 0
            self.index_at_position += 1
            if skip:
                skip -= 1
                continue
            pending.append((stamp, item, (position, self.index_at_position)))
        return pending

    def _send(self, items: list) -> None:
        built = self.chain.build(items)
        if built is None:
            return
        stamp, batch = built
        try:
            self.put((stamp[2], stamp[3], batch, items[-1][2]))
        except QueueError:
            raise
        except Exception as error:  # noqa: BLE001 - the batch cannot cross processes
            outputs: list = [(stamp[2], stamp[3], batch)]
            self.put(unsendable_failure(error, self.label, repr(self.chain.exit), outputs))
            raise _Reported from None
