"""Concatenating streams or map-style blocks."""

from __future__ import annotations

import bisect
import itertools
from typing import Any

from ._base import IterDataPipe, MapDataPipe
from ._state_fields import StateFields
from ._zip import check_inputs

__all__ = ["Concater", "MapConcater"]


class Concater(IterDataPipe):
    """Yield every item of the first stream, then of the next, … (functional: ``concat``).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(Concater(IterableWrapper([1, 2]), IterableWrapper([3])))
        [1, 2, 3]
    """

    inputs = ("datapipes",)

    def __init__(self, *datapipes: IterDataPipe) -> None:
        self.datapipes = check_inputs("concat", datapipes, IterDataPipe)
        self._current = 0

    def reset(self) -> None:
        self._current = 0

    def async_next(self) -> Any:
        datapipes = self.datapipes
        current = self._current
        while current < len(datapipes):
            try:
                return datapipes[current].async_next()
            except StopIteration:
                current = self._current = current + 1
        raise StopIteration

    def __len__(self) -> int:
        return sum(len(dp) for dp in self.datapipes)

    def state_dict(self) -> dict[str, Any]:
        return {"current": self._current}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._current = StateFields(self, state).int("current", maximum=len(self.datapipes))

    def __repr__(self) -> str:
        return "Concater()"


class MapConcater(MapDataPipe):
    """Indices past the first block's end continue into the next (functional: ``concat``).

    Example:
        >>> from pipeloom.datapipes import SequenceWrapper
        >>> dp = MapConcater(SequenceWrapper("ab"), SequenceWrapper("xyz"))
        >>> dp[3], len(dp)
        ('y', 5)
    """

    inputs = ("datapipes",)

    def __init__(self, *datapipes: MapDataPipe) -> None:
        self.datapipes = check_inputs("concat", datapipes, MapDataPipe)
        self._ends: list[int] | None = None

    def _offsets(self) -> list[int]:
        ends = self._ends
        if ends is None:
            ends = self._ends = list(itertools.accumulate(len(dp) for dp in self.datapipes))
        return ends

    def async_get(self, index: int) -> Any:
        ends = self._offsets()
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < ends[-1]:
            raise IndexError(
                f"index {index!r} is out of range for MapConcater of length {ends[-1]}"
            )
        which = bisect.bisect_right(ends, index)
        start = ends[which - 1] if which else 0
        return self.datapipes[which].async_get(index - start)

    def __len__(self) -> int:
        return self._offsets()[-1]

    def reset(self) -> None:
        self._ends = None  # the inputs may have changed length

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return "MapConcater()"
