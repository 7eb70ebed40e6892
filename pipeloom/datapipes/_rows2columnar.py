"""``rows2columnar``: a batch of rows into a dict of columns."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from ._base import IterDataPipe

__all__ = ["Rows2Columnar"]


class Rows2Columnar(IterDataPipe):
    """Turn each batch of rows into ``{column: [values]}`` (functional: ``rows2columnar``).

    Dict rows contribute their keys (only ``column_names`` when given; a row
    lacking one is an error); list rows are named by position with
    ``column_names``. The result is a ``collections.defaultdict(list)``, as in
    torchdata, which compares equal to the plain dict.

    Args:
        source: a block yielding batches (lists) of rows (dicts or lists).
        column_names: the columns to keep (dict rows) or the names of the
            positions (list rows).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> batches = IterableWrapper([[{"a": 1, "b": 2}, {"a": 3, "b": 4}], [[5, 6]]])
        >>> [dict(c) for c in batches.rows2columnar(["a", "b"])]
        [{'a': [1, 3], 'b': [2, 4]}, {'a': [5], 'b': [6]}]
        >>> dict(next(iter(IterableWrapper([[{"a": 1}, {"b": 2, "a": 3}]]).rows2columnar())))
        {'a': [1, 3], 'b': [2]}
    """

    inputs = ("source",)
    per_item = True
    one_to_one = True

    def __init__(self, source: IterDataPipe, column_names: Sequence[str] | None = None) -> None:
        if column_names is not None and (
            isinstance(column_names, (str, bytes)) or not isinstance(column_names, Sequence)
        ):
            raise TypeError(
                f"column_names must be a list of names or None, got {column_names!r}; "
                f"write e.g. column_names=['label', 'text']"
            )
        self.source = source
        self.column_names = [] if column_names is None else list(column_names)

    def async_next(self) -> defaultdict[Any, list[Any]]:
        batch = self.source.async_next()
        columns: defaultdict[Any, list[Any]] = defaultdict(list)
        names = self.column_names
        for row in batch:
            if isinstance(row, Mapping):
                if names:
                    for name in names:
                        if name not in row:
                            raise KeyError(
                                f"rows2columnar(): a row has no column {name!r} (its keys: "
                                f"{sorted(map(str, row))}); fix column_names or the rows"
                            )
                        columns[name].append(row[name])
                else:
                    for name, value in row.items():
                        columns[name].append(value)
            else:
                if len(row) > len(names):
                    raise ValueError(
                        f"rows2columnar(): a list row has {len(row)} values but column_names "
                        f"names {len(names)} ({names}); name every position"
                    )
                for name, value in zip(names, row):
                    columns[name].append(value)
        return columns

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return f"Rows2Columnar(column_names={self.column_names!r})"
