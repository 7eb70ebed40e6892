"""One epoch of a ``DataLoader``: its running record, and the iterator that steps it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ._steps import StepGate

if TYPE_CHECKING:
    from .loader import DataLoader

__all__ = ["Epoch", "EpochIterator"]


class Epoch:
    """One epoch's running state, held by the loader and by the epoch's iterator.

    The loader keeps this record, not the iterator, so the two never refer to
    each other: dropping the last reference to a loader (and its iterator)
    stops the workers by reference counting alone.
    """

    __slots__ = ("epoch", "items", "valid", "finished", "delivered", "stopped_by")

    def __init__(self, epoch: int, items: Iterator[Any], delivered: int) -> None:
        self.epoch = epoch
        self.items = items
        self.valid = True
        self.finished = False  # its last item was delivered
        self.delivered = delivered  # items of the epoch delivered so far (before a resume too)
        self.stopped_by: str | None = None  # the exception that escaped a step

    def invalidate(self, close_items: bool = True) -> None:
        """Make it refuse further items; ``close_items``: also stop its work now."""
        self.valid = False
        close = getattr(self.items, "close", None)
        if close is not None and close_items:
            close()


class EpochIterator(Iterator[Any]):
    """One epoch's items; invalid once a newer epoch starts.

    Each step -- the next item and the count of delivered items -- holds the
    loader's step lock, so a checkpoint sees either both or neither.
    """

    __slots__ = ("_loader", "_record", "_steps", "_lock", "_thread")

    def __init__(self, loader: DataLoader, record: Epoch, steps: StepGate) -> None:
        self._loader = loader
        self._record = record
        self._steps = steps
        self._lock = steps.lock
        self._thread: int | None = None  # the thread inside __next__, if any

    @property
    def epoch(self) -> int:
        return self._record.epoch

    @property
    def delivered(self) -> int:
        return self._record.delivered

    @StepGate.step
    def __next__(self) -> Any:
        if self._steps.waiting:  # another thread asked for the loader between two steps
            self._steps.let_others_in()
        record = self._record
        before: int | None = None
        try:
            with self._lock:
                before = record.delivered
                if record.finished:  # e.g. another thread reading this iterator took the last item
                    raise StopIteration
                if not record.valid:
                    raise self._invalid()
                if self._thread is not None:  # re-entered from the same thread
                    raise RuntimeError(
                        f"next() was called on this iterator over epoch {record.epoch} while a "
                        f"next() on it was still running in the same thread (from a signal "
                        f"handler or from a block of its own pipeline?); call next() from the "
                        f"training loop only"
                    )
                self._thread = self._steps.enter()
                try:
                    item = next(record.items)
                except StopIteration:
                    record.valid, record.finished = False, True
                    self._loader._epoch_finished(record)
                    raise
                except BaseException as error:
                    record.valid = False
                    record.stopped_by = type(error).__name__
                    raise
                finally:
                    self._thread = None
                record.delivered += 1
                return item
        except BaseException as error:
            if before is not None and record.delivered != before:
                # a signal handler raised as the lock was released, after the count: the
                # caller never gets the item
                record.valid = False
                record.stopped_by = record.stopped_by or type(error).__name__
            raise
        finally:
            if self._steps.deferred:  # a shutdown() asked from inside this step
                self._steps.run_deferred()

    def _invalid(self) -> RuntimeError:
        record = self._record
        if record.stopped_by is not None:
            return RuntimeError(
                f"this iterator over epoch {record.epoch} stopped when {record.stopped_by} "
                f"escaped it; start a new epoch with iter(loader), or resume from a checkpoint"
            )
        why = "shutdown() stopped the loader"
        if not self._loader._closed:
            why = self._loader._taken or (
                "a newer iter(loader), load_state_dict() or end_epoch() replaced it"
            )
        return RuntimeError(f"this iterator over epoch {record.epoch} is no longer valid: {why}")
