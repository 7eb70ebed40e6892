"""``repeat``: each item several times in a row."""

from __future__ import annotations

from typing import Any

from ._base import IterDataPipe
from ._expand import Expander

__all__ = ["Repeater"]


class Repeater(Expander):
    """Yield each item ``times`` times before the next one (functional: ``repeat``).

    The copies are the same object (not copied); each carries the stamp of
    its item. To repeat the whole stream, use ``cycle(count)``.

    Args:
        source: the upstream block.
        times: how many times to yield each item (>= 2; use no block for 1).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper(range(3)).repeat(2))
        [0, 0, 1, 1, 2, 2]
    """

    def __init__(self, source: IterDataPipe, times: int) -> None:
        if isinstance(times, bool) or not isinstance(times, int) or times < 2:
            raise ValueError(
                f"times must be an int >= 2, got {times!r}; with times=1 leave repeat() out"
            )
        super().__init__(source)
        self.times = times

    def _expand(self, item: Any) -> list[Any]:
        return [item] * self.times

    def __len__(self) -> int:
        return self.times * len(self.source)

    def __repr__(self) -> str:
        return f"Repeater(times={self.times})"
