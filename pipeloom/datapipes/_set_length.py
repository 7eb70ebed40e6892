"""``set_length``: declare the ``len()`` of a stream."""

from __future__ import annotations

from typing import Any

from ._base import IterDataPipe

__all__ = ["LengthSetter"]


class LengthSetter(IterDataPipe):
    """Pass every item through; ``len()`` returns ``length`` (functional: ``set_length``).

    For streams whose length is known but not computable (after a ``filter``,
    from a source without ``__len__``), so that a ``DataLoader`` or a
    distributed service can use it. Items are not cut or padded: use
    ``header(n)`` to stop after ``n`` items.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> dp = IterableWrapper(range(10)).filter(lambda x: x % 2 == 1).set_length(5)
        >>> len(dp), list(dp)
        (5, [1, 3, 5, 7, 9])
    """

    inputs = ("source",)
    per_item = True
    one_to_one = True

    def __init__(self, source: IterDataPipe, length: int) -> None:
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"length must be an int >= 0, got {length!r}")
        self.source = source
        self.length = length

    def async_next(self) -> Any:
        return self.source.async_next()

    def async_next_many(self, limit: int) -> list[Any]:
        return self.source.async_next_many(limit)

    def _run_stage(self) -> None:
        """In a fused run (``_runs.py``) items pass through: no stage."""
        return None

    def __len__(self) -> int:
        return self.length

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return f"LengthSetter(length={self.length})"
