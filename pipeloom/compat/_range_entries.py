"""A ``SequentialSampler``'s epoch as arithmetic: no array, whatever the dataset's size.

``SequentialSampler`` yields ``0 .. n-1`` and a ``BatchSampler`` over it cuts
runs of ``batch_size``, so entry ``i`` is known from ``i`` alone. Holding it
as an int64 array cost 8 bytes per index, and copying that into the shared
plan board for worker processes made the start grow with the dataset (800 MB
and seconds at 100 million items, where torch's loader starts at once).
"""

from __future__ import annotations

from typing import Any

__all__ = ["RangeEntries"]


class RangeEntries:
    """Indices ``lo .. hi-1``, one per entry (``batch_size=None``) or in runs of ``batch_size``.

    Reads like :class:`~._plan.PlanEntries`: the same entries, ``tail`` and
    ``indices_before``; a checkpoint keeps its recipe and position.

    Example:
        >>> entries = RangeEntries.epoch(7, batch_size=3, drop_last=False)
        >>> len(entries), entries[0], entries[2], entries.tail(1)[0]
        (3, [0, 1, 2], [6], [3, 4, 5])
        >>> RangeEntries.epoch(7, batch_size=3, drop_last=True).flattened()[5]
        5
    """

    def __init__(
        self, lo: int, hi: int, batch_size: int | None, recipe: Any = None, start: int = 0
    ) -> None:
        self._lo, self._hi, self._batch_size = lo, hi, batch_size
        self._recipe = recipe  # how a checkpoint draws the epoch again (an EpochRecipe)
        self._start = start  # entries of the epoch before these

    @classmethod
    def epoch(
        cls, n: int, batch_size: int | None, drop_last: bool, recipe: Any = None
    ) -> RangeEntries:
        """A whole epoch of ``SequentialSampler`` over ``n`` items (batched as ``BatchSampler``)."""
        hi = n if batch_size is None or not drop_last else n // batch_size * batch_size
        return cls(0, hi, batch_size, recipe)

    def __len__(self) -> int:
        size = self._batch_size
        return self._hi - self._lo if size is None else -(-(self._hi - self._lo) // size)

    def __getitem__(self, index: Any) -> Any:
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"RangeEntries takes one int index, got {type(index).__name__}")
        if not 0 <= index < len(self):
            raise IndexError(f"entry {index} of {len(self)}")
        size = self._batch_size
        if size is None:
            return self._lo + index
        first = self._lo + index * size
        return list(range(first, min(first + size, self._hi)))

    def flattened(self) -> RangeEntries:
        """One entry per index."""
        return RangeEntries(self._lo, self._hi, None)

    def tail(self, start: int) -> RangeEntries:
        """The entries from ``start`` on."""
        lo = min(self._lo + self.indices_before(start), self._hi)
        return RangeEntries(lo, self._hi, self._batch_size, self._recipe, self._start + start)

    def indices_before(self, start: int) -> int:
        """How many indices the entries before ``start`` hold."""
        size = 1 if self._batch_size is None else self._batch_size
        return min(start * size, self._hi - self._lo)

    def for_workers(self) -> RangeEntries:
        """What worker processes read (no recipe)."""
        return RangeEntries(self._lo, self._hi, self._batch_size)

    def to_state(self) -> dict[str, Any]:
        """A checkpoint's form: the recipe and how many entries come before these."""
        if self._recipe is None:
            raise ValueError("these entries were not drawn from a recipe")
        return {"recipe": self._recipe.to_state(), "start": self._start}

    def __repr__(self) -> str:
        return f"RangeEntries({len(self)} entries)"
