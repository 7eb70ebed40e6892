"""One epoch of ``pipeloom.compat.DataLoader``: its batches, counted, one step at a time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .._steps import StepGate
from ._plan import EpochPlan

if TYPE_CHECKING:
    from ._loader import DataLoader

__all__ = ["CompatIterator"]


class CompatIterator(Iterator[Any]):
    """One epoch of batches; ``len()`` as torch's iterator.

    Each step -- a batch and the count -- holds the loader's step lock.
    """

    def __init__(
        self,
        loader: DataLoader,
        items: Iterator[Any],
        plan: EpochPlan,
        skip: int,
        steps: StepGate,
    ) -> None:
        self._loader = loader  # the loader refers to its iterator weakly: no cycle
        self._items = items
        self.plan = plan
        self._steps = steps
        self.delivered = 0
        self.finished = False
        self.stopped_by: str | None = None  # the exception that escaped a step
        for _ in range(skip):  # an iterable dataset resumes by re-reading: drop what was seen
            next(self._items, None)
            self.delivered += 1

    def __next__(self) -> Any:
        steps = self._steps
        if steps.waiting:  # another thread asked for the loader between two batches
            steps.let_others_in()
        with steps.lock:
            if self.stopped_by is not None:
                raise RuntimeError(
                    f"this epoch stopped when {self.stopped_by} escaped next() at batch "
                    f"{self.delivered}; torch's DataLoader would go on with the next batch, "
                    f"pipeloom.compat does not (the pipeline may hold part of the failed "
                    f"batch). To skip bad samples, catch the error in __getitem__ (or "
                    f"collate_fn); to go on, start a new epoch with iter(loader) or resume "
                    f"from a checkpoint"
                )
            try:
                item = next(self._items)
            except StopIteration:
                self.finished = True
                self._loader.settle_draws()
                raise
            except BaseException as error:
                self.stopped_by = self.stopped_by or type(error).__name__
                raise
            self.delivered += 1
            return item

    def __len__(self) -> int:
        return len(self._loader)

    def close(self) -> None:
        """Abandon the epoch: stop its work (the workers stay if persistent)."""
        invalidate = getattr(self._items, "invalidate", None)
        if invalidate is not None and not self.finished:
            invalidate()
