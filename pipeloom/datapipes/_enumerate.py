"""``enumerate``: number the items."""

from __future__ import annotations

from typing import Any

from .._validate import check_int
from ._base import IterDataPipe
from ._state_fields import StateFields

__all__ = ["Enumerator"]


class Enumerator(IterDataPipe):
    """Yield ``(index, item)`` pairs from ``starting_index`` (functional name: ``enumerate``).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper("ab").enumerate(starting_index=1))
        [(1, 'a'), (2, 'b')]
    """

    inputs = ("source",)

    def __init__(self, source: IterDataPipe, starting_index: int = 0) -> None:
        check_int("starting_index", starting_index)
        self.source = source
        self.starting_index = starting_index
        self._index = starting_index

    def reset(self) -> None:
        self._index = self.starting_index

    def async_next(self) -> Any:
        item = self.source.async_next()
        index = self._index
        self._index = index + 1
        return index, item

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {"index": self._index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._index = StateFields(self, state).int("index", minimum=self.starting_index)

    def __repr__(self) -> str:
        return f"Enumerator(starting_index={self.starting_index})"
