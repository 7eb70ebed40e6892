"""Column selection inside each item: ``drop``, ``slice`` and ``flatten``.

Items are tuples, lists (columns by position) or dicts (columns by key); the
result has the item's type. A column named but missing from an item is an
error naming the column (torchdata 0.9 warned and went on, possibly with
the whole item): a silently different sample is worse than a stop.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> rows = IterableWrapper([(0, 10, (100, 1000)), (1, 11, (111, 1001))])
    >>> list(rows.drop(1))
    [(0, (100, 1000)), (1, (111, 1001))]
    >>> list(rows.slice(0, 2))
    [(0, 10), (1, 11)]
    >>> list(rows.flatten(2))
    [(0, 10, 100, 1000), (1, 11, 111, 1001)]
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from ._base import IterDataPipe

__all__ = ["Dropper", "Flattener", "Slicer"]


def _as_columns(indices: Any, owner: str) -> tuple[Hashable, ...]:
    columns = tuple(indices) if isinstance(indices, (list, tuple)) else (indices,)
    for column in columns:
        try:
            hash(column)
        except TypeError:
            raise TypeError(
                f"{owner}() expects column indices or keys (hashable), got "
                f"{type(column).__name__} {column!r}"
            ) from None
    return columns


def _check_item(item: Any, owner: str) -> None:
    if not isinstance(item, (tuple, list, dict)):
        raise TypeError(
            f"{owner}() works on tuple, list or dict items, got {type(item).__name__} "
            f"{item!r:.60}; map the items to one of those first"
        )


def _positions(item: Sequence[Any], columns: tuple[Hashable, ...], owner: str) -> set[int]:
    """The positions of ``columns`` in a tuple or list item (negative ones count from the end)."""
    found = set()
    for column in columns:
        if isinstance(column, bool) or not isinstance(column, int):
            raise TypeError(
                f"{owner}(): a {type(item).__name__} item has columns by position, got the "
                f"column {column!r}; use an int (keys are for dict items)"
            )
        if not -len(item) <= column < len(item):
            raise IndexError(
                f"{owner}(): the item has {len(item)} columns, so there is no column "
                f"{column}; item: {item!r:.60}"
            )
        found.add(column % len(item))
    return found


def _check_keys(item: dict, columns: tuple[Hashable, ...], owner: str) -> None:
    for column in columns:
        if column not in item:
            raise KeyError(
                f"{owner}(): the item has no key {column!r} (its keys: {list(item)!r:.80})"
            )


def _rebuild(item: Any, values: list[Any]) -> Any:
    return tuple(values) if isinstance(item, tuple) else values


class _ColumnBlock(IterDataPipe):
    inputs = ("source",)
    per_item = True
    one_to_one = True

    def __init__(self, source: IterDataPipe) -> None:
        self.source = source

    def _apply(self, item: Any) -> Any:
        raise NotImplementedError

    def async_next(self) -> Any:
        return self._apply(self.source.async_next())

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {}


class Dropper(_ColumnBlock):
    """Remove the given columns from each item (functional: ``drop``).

    Args:
        source: a block yielding tuples, lists or dicts.
        indices: a column (position or key) or a list of them.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper([{"a": 1, "b": 2, "c": 3}]).drop(["a", "c"]))
        [{'b': 2}]
    """

    def __init__(self, source: IterDataPipe, indices: Hashable | list[Hashable]) -> None:
        super().__init__(source)
        self.indices = indices
        self._columns = _as_columns(indices, "drop")

    def _apply(self, item: Any) -> Any:
        _check_item(item, "drop")
        if isinstance(item, dict):
            _check_keys(item, self._columns, "drop")
            return {k: v for k, v in item.items() if k not in self._columns}
        gone = _positions(item, self._columns, "drop")
        return _rebuild(item, [v for i, v in enumerate(item) if i not in gone])

    def __repr__(self) -> str:
        return f"Dropper(indices={self.indices!r})"


class Slicer(_ColumnBlock):
    """Keep a slice or a set of columns of each item (functional: ``slice``).

    With an int ``index``, tuples and lists become ``item[index:stop:step]``
    and dicts keep the single key ``index``. With a list, the listed columns
    are kept, in the item's order.

    Args:
        source: a block yielding tuples, lists or dicts.
        index: the slice's start, or a list of the columns to keep.
        stop: the slice's end (not with a list of columns).
        step: the slice's step (not with a list of columns).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper([(0, 1, 2, 3, 4)]).slice(1, None, 2))
        [(1, 3)]
        >>> list(IterableWrapper([{"a": 1, "b": 2, "c": 3}]).slice(["c", "a"]))
        [{'a': 1, 'c': 3}]
    """

    def __init__(
        self,
        source: IterDataPipe,
        index: int | list[Hashable],
        stop: int | None = None,
        step: int | None = None,
    ) -> None:
        super().__init__(source)
        if isinstance(index, (list, tuple)) and (stop is not None or step is not None):
            raise ValueError(
                f"slice() got a list of columns {index!r} and stop={stop!r}/step={step!r}; "
                f"pass either the columns to keep, or start/stop/step"
            )
        for name, value in (("stop", stop), ("step", step)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"slice() {name} must be an int or None, got {value!r}")
        if step == 0:
            raise ValueError("slice() step must not be zero")
        self.index, self.stop, self.step = index, stop, step
        self._columns = _as_columns(index, "slice") if isinstance(index, (list, tuple)) else None

    def _apply(self, item: Any) -> Any:
        _check_item(item, "slice")
        columns = self._columns
        if isinstance(item, dict):
            wanted = columns if columns is not None else _as_columns(self.index, "slice")
            _check_keys(item, wanted, "slice")
            return {k: v for k, v in item.items() if k in wanted}
        if columns is not None:
            kept = _positions(item, columns, "slice")
            return _rebuild(item, [v for i, v in enumerate(item) if i in kept])
        if isinstance(self.index, bool) or not isinstance(self.index, int):
            raise TypeError(
                f"slice(): a {type(item).__name__} item is sliced by position, got "
                f"index={self.index!r}"
            )
        return item[self.index : self.stop : self.step]

    def __repr__(self) -> str:
        return f"Slicer(index={self.index!r}, stop={self.stop!r}, step={self.step!r})"


class Flattener(_ColumnBlock):
    """Splice nested columns into their item (functional: ``flatten``).

    In tuples and lists, a column holding a list or tuple is replaced by its
    elements; in dicts, a column holding a dict is replaced by its entries.
    ``indices=None`` flattens every such column, one level.

    Args:
        source: a block yielding tuples, lists or dicts.
        indices: a column or a list of columns to flatten; None for all.

    Raises (while iterating):
        ValueError: a dict entry that would overwrite an existing key.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper([(0, (1, 2)), (3, (4, 5))]).flatten())
        [(0, 1, 2), (3, 4, 5)]
        >>> list(IterableWrapper([{"id": 1, "meta": {"w": 2, "h": 3}}]).flatten("meta"))
        [{'id': 1, 'w': 2, 'h': 3}]
    """

    def __init__(
        self, source: IterDataPipe, indices: Hashable | list[Hashable] | None = None
    ) -> None:
        super().__init__(source)
        self.indices = indices
        self._columns = None if indices is None else _as_columns(indices, "flatten")

    def _apply(self, item: Any) -> Any:
        _check_item(item, "flatten")
        if isinstance(item, dict):
            return self._flatten_dict(item)
        columns = self._columns
        chosen = set(range(len(item))) if columns is None else _positions(item, columns, "flatten")
        values: list[Any] = []
        for i, value in enumerate(item):
            if i in chosen and isinstance(value, (list, tuple)):
                values.extend(value)
            else:
                values.append(value)
        return _rebuild(item, values)

    def _flatten_dict(self, item: dict) -> dict:
        columns = self._columns
        if columns is not None:
            _check_keys(item, columns, "flatten")
        out: dict = {}
        for key, value in item.items():
            if (columns is None or key in columns) and isinstance(value, dict):
                for sub_key, sub_value in value.items():
                    if sub_key in item or sub_key in out:
                        raise ValueError(
                            f"flatten(): the key {sub_key!r} of column {key!r} already exists in "
                            f"the item; rename one of them first (e.g. with .map)"
                        )
                    out[sub_key] = sub_value
            else:
                out[key] = value
        return out

    def __repr__(self) -> str:
        return f"Flattener(indices={self.indices!r})"
