"""``header``: the first ``limit`` items."""

from __future__ import annotations

from typing import Any

from .._validate import check_int
from ._base import IterDataPipe
from ._state_fields import StateFields

__all__ = ["Header"]


class Header(IterDataPipe):
    """Yield at most the first ``limit`` items (functional name: ``header``).

    The upstream is not asked for more items once ``limit`` are yielded.

    Args:
        source: the upstream block.
        limit: how many items; ``None`` for all of them.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper(range(100)).header(3))
        [0, 1, 2]
    """

    inputs = ("source",)

    def __init__(self, source: IterDataPipe, limit: int | None = 10) -> None:
        check_int(
            "limit", limit, minimum=0, allow_none=True, hint="use limit=None to yield every item"
        )
        self.source = source
        self.limit = limit
        self._count = 0

    def reset(self) -> None:
        self._count = 0

    def async_next(self) -> Any:
        count = self._count
        if self.limit is not None and count >= self.limit:
            raise StopIteration
        item = self.source.async_next()
        self._count = count + 1
        return item

    def __len__(self) -> int:
        try:
            length = len(self.source)
        except TypeError:
            raise TypeError(
                f"Header(limit={self.limit}) has no known length: its input "
                f"{type(self.source).__name__} has none, so it may end before {self.limit} "
                f"items; the limit is only an upper bound"
            ) from None
        return length if self.limit is None else min(length, self.limit)

    def state_dict(self) -> dict[str, Any]:
        return {"count": self._count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._count = StateFields(self, state).int("count", maximum=self.limit)

    def __repr__(self) -> str:
        return f"Header(limit={self.limit!r})"
