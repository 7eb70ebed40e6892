"""Zipping streams or map-style blocks into tuples."""

from __future__ import annotations

from typing import Any

from ..errors import NotAvailable
from ._base import IterDataPipe, MapDataPipe
from ._context import NO_STAMP, current_stamp, restore_stamp
from ._state_fields import StateFields

__all__ = ["MapZipper", "Zipper", "pull_in_own_stamp"]

_MISSING = object()


def check_inputs(op: str, datapipes: tuple[Any, ...], kind: type) -> tuple[Any, ...]:
    """Raise a clear error unless ``datapipes`` is a non-empty tuple of ``kind`` blocks."""
    if not datapipes:
        raise ValueError(f"{op}() needs at least one input block, got none")
    for position, dp in enumerate(datapipes, start=1):
        if isinstance(dp, kind):
            continue
        got = type(dp).__name__
        if kind is IterDataPipe and isinstance(dp, MapDataPipe):
            fix = f"{got} is a MapDataPipe; convert it with .to_iter()"
        elif kind is MapDataPipe and isinstance(dp, IterDataPipe):
            fix = (
                f"{got} is an IterDataPipe, which has no random access; "
                f"use the {op}() of IterDataPipe"
            )
        else:
            wrapper = "IterableWrapper" if kind is IterDataPipe else "SequenceWrapper"
            fix = f"wrap it with {wrapper}(...)"
        article = "an" if kind is IterDataPipe else "a"
        raise TypeError(
            f"{op}() argument {position} must be {article} {kind.__name__}, got {got}; {fix}"
        )
    return tuple(datapipes)


def pull_in_own_stamp(source: IterDataPipe, stamps: list[tuple], index: int) -> Any:
    """``source.async_next()`` in the item stamp where source ``index`` left off.

    A block reading several sources keeps one stamp per source, so what one
    source's blocks see (``item_rng()`` draws, the stamp of an item they emit
    again) never depends on what the others did in between.
    """
    restore_stamp(stamps[index])
    try:
        return source.async_next()
    finally:
        stamps[index] = current_stamp()


class Zipper(IterDataPipe):
    """Yield tuples with one item of each stream; stop at the shortest (functional: ``zip``).

    Each stream goes on in its own item stamp; a tuple carries its first
    item's stamp (as ``batch`` does).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(Zipper(IterableWrapper("ab"), IterableWrapper(range(5))))
        [('a', 0), ('b', 1)]
    """

    inputs = ("datapipes",)

    def __init__(self, *datapipes: IterDataPipe) -> None:
        self.datapipes = check_inputs("zip", datapipes, IterDataPipe)
        self.reset()

    def reset(self) -> None:
        self._partial: list[Any] = []
        self._done = False
        self._stamps: list[tuple] = [NO_STAMP] * len(self.datapipes)

    def async_next(self) -> tuple[Any, ...]:
        if self._done:
            raise StopIteration
        partial, stamps = self._partial, self._stamps
        datapipes = self.datapipes
        try:
            for index in range(len(partial), len(datapipes)):
                # NotAvailable keeps the partial tuple
                partial.append(pull_in_own_stamp(datapipes[index], stamps, index))
        except StopIteration:
            self._done = True
            partial.clear()
            raise
        self._partial = []
        restore_stamp(stamps[0])
        return tuple(partial)

    def __len__(self) -> int:
        return min(len(dp) for dp in self.datapipes)

    def state_dict(self) -> dict[str, Any]:
        return {"partial": list(self._partial), "done": self._done, "stamps": list(self._stamps)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        partial = fields.list("partial")
        if len(partial) >= len(self.datapipes):
            count = len(self.datapipes)
            fields.fail("partial", f"a list of fewer than {count} items (one per input)", partial)
        self._done = fields.bool("done")
        self._partial = partial
        self._stamps = load_stamps(fields, len(self.datapipes))

    def __repr__(self) -> str:
        return "Zipper()"


def load_stamps(fields: StateFields, count: int) -> list[tuple]:
    """The per-source stamps of a state (``NO_STAMP`` each in a state saved without them)."""
    if "stamps" not in fields.state:
        return [NO_STAMP] * count
    return fields.stamps("stamps", length=count)


class MapZipper(MapDataPipe):
    """Index ``i`` gives the tuple of item ``i`` of each block (functional: ``zip``).

    The length is the shortest input's.

    Example:
        >>> from pipeloom.datapipes import SequenceWrapper
        >>> dp = MapZipper(SequenceWrapper("abc"), SequenceWrapper([1, 2]))
        >>> dp[1], len(dp)
        (('b', 2), 2)
    """

    inputs = ("datapipes",)

    def __init__(self, *datapipes: MapDataPipe) -> None:
        self.datapipes = check_inputs("zip", datapipes, MapDataPipe)
        self._pending: dict[int, list[Any]] = {}

    def async_get(self, index: int) -> tuple[Any, ...]:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} is out of range for MapZipper of length {len(self)}")
        parts = self._pending.pop(index, None)
        if parts is None:
            parts = [_MISSING] * len(self.datapipes)
        missing = False
        for position, dp in enumerate(self.datapipes):
            if parts[position] is _MISSING:
                try:
                    parts[position] = dp.async_get(index)
                except NotAvailable:
                    missing = True  # requested; the others are requested too
        if missing:
            self._pending[index] = parts
            raise NotAvailable
        return tuple(parts)

    def __len__(self) -> int:
        return min(len(dp) for dp in self.datapipes)

    def reset(self) -> None:
        self._pending = {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return "MapZipper()"
