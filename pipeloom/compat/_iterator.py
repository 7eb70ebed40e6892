"""One epoch of ``pipeloom.compat.DataLoader``: its batches, counted, one step at a time."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .._steps import StepGate
from ..datapipes.runtime import current_position
from ..errors import PipeloomError, StateError, WorkerError, WorkerTimeout
from ._plan import EpochPlan

if TYPE_CHECKING:
    from ._loader import DataLoader

__all__ = ["CompatIterator", "EpochRest"]


@dataclass(frozen=True)
class EpochRest:
    """Where an unfinished epoch stopped: what a checkpoint keeps of it."""

    plan: EpochPlan  # the epoch from its first batch not delivered
    delivered: int  # batches of ``plan`` delivered (an IterableDataset re-reads them)
    iterable: bool
    workers: int
    refusal: str | None  # why the position is not exact (then it cannot be saved)

    @property
    def asked(self) -> int:
        """Batches of the epoch delivered or failed (counting those before a resume)."""
        return self.plan.first + self.delivered + len(self.plan.skip)

    def to_state(self) -> dict[str, Any]:
        """The ``"epoch"`` entry of the loader's state.

        Raises:
            StateError: the position is not exact.
        """
        if self.refusal is not None:
            raise StateError(self.refusal)
        state = self.plan.to_state(self.delivered, iterable=self.iterable)
        if self.iterable:  # its batches depend on how many workers read it
            state["workers"] = self.workers
        return state


class CompatIterator(Iterator[Any]):
    """One epoch of batches; ``len()`` as torch's iterator.

    Each step -- a batch and the count -- holds the loader's step lock.
    """

    def __init__(
        self,
        loader: DataLoader,
        items: Iterator[Any],
        plan: EpochPlan,
        steps: StepGate,
    ) -> None:
        self._loader = loader  # the loader refers to its iterator weakly: no cycle
        self._items = items
        self.plan = plan
        self._steps = steps
        self.delivered = 0
        self.finished = False
        self.stopped_by: str | None = None  # the exception that escaped a step
        self.skipped = 0  # batches before this plan: delivered ones, and failed ones
        self.can_go_on = False
        self.closed_why: str | None = None  # why next() refuses: see close()
        # Batches counted by their positions, when counting them in order is not enough:
        # an IterableDataset's re-read epoch, batches in arrival order (in_order=False),
        # or a plan that leaves some out.
        self._by_position = loader.is_iterable or bool(plan.skip) or not loader.delivers_in_order
        self._in_order = loader.delivers_in_order
        self.done_below = plan.first  # positions under it were delivered (or do not exist)
        self.done = set(plan.skip)  # and these, at or above it
        # An IterableDataset's: how many outputs of each worker were delivered (each
        # worker's come in its own order; worker i of n makes positions i, n + i, ...).
        self._readers = max(1, loader.num_workers) if loader.is_iterable else 0
        self._outputs = list(plan.outputs or [0] * self._readers)
        self._failed_unknown = False  # a failed batch whose position no worker gave
        # a sampler drawn as the epoch goes (see _live): torch's iterator has asked it for
        # the batches returned, and `ahead` more (none more without workers: the thread
        # that calls next() draws on demand)
        self._ahead = loader._ahead
        self._board = loader._board

    def replay(self, skip: int) -> None:
        """An iterable dataset resumes by re-reading: drop the ``skip`` batches seen.

        For states of older pipeloom, which counted them (newer ones name their
        positions, left out as they come). Inside ``iter()``, which holds the
        loader, once the loader knows this iterator: a ``shutdown()`` from
        another thread wakes a wait here too, naming the batch
        (``_waited_for``), and the state then resumes there.
        """
        for _ in range(skip):
            next(self._items, None)
            self._seen_before(current_position())
            self.delivered += 1

    @StepGate.step
    def __next__(self) -> Any:
        if self.closed_why is not None:
            raise RuntimeError(f"this iterator is no longer valid: {self.closed_why}")
        steps = self._steps
        if steps.waiting:  # another thread asked for the loader between two batches
            steps.let_others_in()
        before: int | None = None
        try:
            with steps.lock:
                steps.enter()  # a shutdown() elsewhere can wake it
                before = self.delivered
                if self.stopped_by is not None:
                    self._go_on_or_refuse()
                    before = self.delivered
                try:
                    item = next(self._items)
                    while self._by_position and self._seen_before(current_position()):
                        item = next(self._items)  # an IterableDataset's output delivered before
                except StopIteration:
                    self.finished = True
                    self._loader.settle_draws()
                    raise
                except BaseException as error:
                    self._stopped(error)
                    raise
                self.delivered += 1
                if getattr(self.plan.entries, "is_live", False):
                    self._draw_ahead()
                return item
        except BaseException as error:
            if before is not None and self.delivered != before and self.stopped_by is None:
                # a signal handler raised as the lock was released, after the count: the
                # caller never gets this batch, so it counts as the one that failed
                self.delivered -= 1
                self._stopped(error)
            raise
        finally:
            if steps.deferred:  # a shutdown() asked from inside this step
                steps.run_deferred()

    def _draw_ahead(self) -> None:
        """Draw a live plan's outputs as torch's iterator would have by now; hand them over."""
        plan = self.plan
        low = self.next_batch()
        draws = plan.entries.draws  # type: ignore[attr-defined]
        draws.keep_from(low)  # a checkpoint or a catch-up reads none before it
        draws.draw_to(plan.first + self.delivered + len(plan.skip) + self._ahead)
        self._board.feed(low)

    def _seen_before(self, position: int | None) -> bool:
        """Whether the batch at ``position`` was delivered before; if not, count it delivered."""
        if position is None:
            return False
        if self._readers:  # an IterableDataset's output
            worker, k = position % self._readers, position // self._readers
            if k < self._outputs[worker]:
                return True
            self._outputs[worker] = k + 1
            return False
        if position < self.done_below or position in self.done:
            return True
        done = self.done
        if self._in_order:  # every position under it came first, or does not exist
            self.done_below = position + 1
            if done:
                done.difference_update([p for p in done if p <= position])
        else:
            done.add(position)
        while self.done_below in done:
            done.discard(self.done_below)
            self.done_below += 1
        return False

    def next_batch(self) -> int:
        """The epoch position of the first batch not delivered yet."""
        if self._readers:
            return sum(self._outputs)
        return self.done_below if self._by_position else self.plan.first + self.delivered

    def rest(self) -> EpochRest | None:
        """Where this epoch stopped, for a checkpoint (None once it finished)."""
        if self.finished:
            return None
        refusal = None
        if self.stopped_by is not None and not self.can_go_on:
            refusal = (
                f"no exact position to save: {self.stopped_by} escaped next(loader) while "
                f"batch {self.delivered} was being made, so the random generators may be "
                f"part-way through it. Save checkpoints between steps, and resume from the "
                f"last one"
            )
        if self._readers:
            plan, delivered = replace(self.plan, outputs=tuple(self._outputs)), 0
        elif self._by_position:
            plan, delivered = self.plan.without(self.done_below, self.done), 0
        else:  # after a failed batch: the batches after it, as next() goes on
            plan, delivered = self.plan, self.delivered + (self.stopped_by is not None)
        loader = self._loader
        return EpochRest(plan, delivered, loader.is_iterable, loader.num_workers, refusal)

    def __del__(self) -> None:
        # dropped mid-epoch (a ``break`` out of the loop): the loader keeps where it stopped
        if getattr(self, "closed_why", "") is None and not self.finished:
            self._loader.keep_abandoned(self.rest())

    def _stopped(self, error: BaseException) -> None:
        self.stopped_by = self.stopped_by or type(error).__name__
        self.can_go_on = can_go_on_after(error, iterable=self._loader.is_iterable)
        if self.can_go_on and self._by_position:  # the failed batch is not delivered again
            # in order, the failed batch is the next one; in arrival order, its worker says
            failed = self.done_below if self._in_order else _failed_position(error)
            self._failed_unknown = failed is None
            self.can_go_on = failed is not None
            if failed is not None:
                self._seen_before(failed)
        if isinstance(error, WorkerError) and error.original_type is None:
            self._name_sampler_output(error)
            _torch_prefix(error)

    def _name_sampler_output(self, error: WorkerError) -> None:
        """A dead worker's item is a position of the plan: say which sampler output it is."""
        plan, position = self.plan, error.item
        if position is None or self._loader.is_iterable:
            return
        if position < plan.first:
            return
        try:
            entry = plan.entries[position - plan.first]
        except IndexError:  # not in the plan, or a live plan's output no longer held
            return
        what = f"batch {position}, indices {entry}" if isinstance(entry, list) else f"index {entry}"
        error.add_detail(f" (here: {what})")

    def _go_on_or_refuse(self) -> None:
        """After a failed batch: go on with the next one, as torch's iterator does.

        The epoch restarts from the batch after the failed one (the remaining
        plan, as a resume from a checkpoint would): batches and order are
        torch's; worker processes start their global-RNG streams afresh.
        """
        if not self.can_go_on:
            raise RuntimeError(
                f"this epoch stopped when {self.stopped_by} escaped next() at batch "
                f"{self.skipped + self.delivered}, and it cannot go on ({self._can_go_on_why()}). "
                f"To skip bad samples, catch the error in __getitem__ (or collate_fn); to go "
                f"on, start a new epoch with iter(loader) or resume from a checkpoint"
            )
        after = self.delivered + 1  # the failed batch is skipped, not delivered
        if self._by_position:
            self.plan = self.plan.without(self.done_below, self.done)
        else:
            self.plan = self.plan.tail(after)
        self.skipped += after
        self.delivered = 0
        self.stopped_by = None
        self._items = self._loader.run_plan(self.plan)

    def _can_go_on_why(self) -> str:
        if self._loader.is_iterable:
            return "an IterableDataset's iterator cannot be resumed past the error"
        if self._failed_unknown:
            return "no worker said which batch failed, and batches come in arrival order"
        return "the error was not raised by the dataset or collate_fn"

    def __len__(self) -> int:
        return len(self._loader)

    def close(self, why: str) -> None:
        """Abandon the epoch, saying ``why`` to a later ``next()``: stop its work (the
        workers stay if persistent)."""
        if not self.finished:
            self.closed_why = why
        invalidate = getattr(self._items, "invalidate", None)
        if invalidate is not None and not self.finished:
            invalidate()


def can_go_on_after(error: BaseException, *, iterable: bool) -> bool:
    """Whether an epoch can go on after ``error`` escaped ``next()``, as torch's does.

    Only over a map-style dataset (its plan says which batches come next),
    and only after an exception of the user's code (``__getitem__``,
    ``collate_fn``, the sampler's batches): not after a dead worker, a
    timeout or an interrupt.
    """
    if iterable or not isinstance(error, Exception) or isinstance(error, WorkerTimeout):
        return False
    origin = error if isinstance(error, WorkerError) else error.__cause__
    if isinstance(origin, WorkerError):
        return origin.original_type is not None  # None: the worker died
    return not isinstance(error, PipeloomError)


def _failed_position(error: BaseException) -> int | None:
    """The plan position of the batch whose failure ``error`` is, when a worker said it."""
    origin = error if isinstance(error, WorkerError) else error.__cause__
    item = origin.item if isinstance(origin, WorkerError) else None
    return item if isinstance(item, int) else None


def _torch_prefix(error: WorkerError) -> None:
    """Start a dead worker's message as torch's does (code may match on it)."""
    if error.dead_pid is None:
        return  # not a worker process's death
    prefix = f"DataLoader worker (pid(s) {error.dead_pid}) exited unexpectedly: "
    message = str(error.args[0]) if error.args else ""
    if not message.startswith(prefix):
        error.args = (prefix + message, *error.args[1:])
