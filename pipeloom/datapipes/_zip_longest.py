"""``zip_longest``: zip streams until the longest ends, filling the shorter ones."""

from __future__ import annotations

from typing import Any

from ._base import IterDataPipe
from ._context import NO_STAMP, restore_stamp
from ._state_fields import StateFields
from ._zip import check_inputs, load_stamps, pull_in_own_stamp

__all__ = ["ZipperLongest"]

_MISSING = object()


class ZipperLongest(IterDataPipe):
    """Yield tuples of one item per stream until all have ended (functional: ``zip_longest``).

    A stream that ended contributes ``fill_value``. Each stream goes on in its
    own item stamp; a tuple carries the stamp of its first item not filled.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper("ab").zip_longest(IterableWrapper(range(3)), fill_value="-"))
        [('a', 0), ('b', 1), ('-', 2)]
    """

    inputs = ("datapipes",)

    def __init__(self, *datapipes: IterDataPipe, fill_value: Any = None) -> None:
        self.datapipes = check_inputs("zip_longest", datapipes, IterDataPipe)
        self.fill_value = fill_value
        self.reset()

    def reset(self) -> None:
        self._partial: list[Any] = []
        self._ended = [False] * len(self.datapipes)
        self._stamps: list[tuple] = [NO_STAMP] * len(self.datapipes)

    def async_next(self) -> tuple[Any, ...]:
        partial, ended = self._partial, self._ended
        for index in range(len(partial), len(self.datapipes)):
            if ended[index]:
                partial.append(_MISSING)
                continue
            try:
                # NotAvailable keeps the partial tuple
                partial.append(pull_in_own_stamp(self.datapipes[index], self._stamps, index))
            except StopIteration:
                ended[index] = True
                partial.append(_MISSING)
        self._partial = []
        if all(ended) and all(value is _MISSING for value in partial):
            raise StopIteration
        first = next(i for i, value in enumerate(partial) if value is not _MISSING)
        restore_stamp(self._stamps[first])
        return tuple(self.fill_value if value is _MISSING else value for value in partial)

    def __len__(self) -> int:
        return max(len(dp) for dp in self.datapipes)

    def state_dict(self) -> dict[str, Any]:
        partial = [("missing", None) if v is _MISSING else ("item", v) for v in self._partial]
        return {"partial": partial, "ended": list(self._ended), "stamps": list(self._stamps)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._partial = [_MISSING if kind == "missing" else v for kind, v in state["partial"]]
        self._ended = [bool(e) for e in state["ended"]]
        self._stamps = load_stamps(StateFields(self, state), len(self.datapipes))

    def __repr__(self) -> str:
        return f"ZipperLongest(fill_value={self.fill_value!r})"
