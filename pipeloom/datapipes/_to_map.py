"""``to_map_datapipe``: a stream of ``(key, value)`` items as a map-style block."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from ._base import BlockingReader, IterDataPipe, MapDataPipe
from ._map import check_callable, fn_name
from ._pipeline import reset_pipeline

__all__ = ["IterToMapConverter"]


class IterToMapConverter(MapDataPipe):
    """Read a stream once into a dict; index it by key (functional: ``to_map_datapipe``).

    The stream is read at the first access (a lookup or ``len()``), where the
    block runs, and kept in memory. Items are ``(key, value)`` pairs, or
    ``key_value_fn(item)`` makes them so. A key seen twice keeps its last
    value, with a warning.

    Args:
        source: the stream to read.
        key_value_fn: item -> ``(key, value)``; None when items are pairs.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> table = IterableWrapper(["ant", "bee"]).to_map_datapipe(lambda w: (w[0], w))
        >>> table["b"], len(table)
        ('bee', 2)
    """

    inputs = ("source",)

    def __init__(
        self, source: IterDataPipe, key_value_fn: Callable[[Any], Any] | None = None
    ) -> None:
        if not isinstance(source, IterDataPipe):
            raise TypeError(
                f"to_map_datapipe() expects an IterDataPipe, got {type(source).__name__}"
            )
        if key_value_fn is not None:
            check_callable(key_value_fn, "key_value_fn", "to_map_datapipe", 1)
        self.source = source
        self.key_value_fn = key_value_fn
        self._table: dict[Any, Any] | None = None

    def _load(self) -> dict[Any, Any]:
        if self._table is None:
            table: dict[Any, Any] = {}
            reset_pipeline(self.source)
            reader = BlockingReader(self.source)
            duplicates = []
            while True:
                try:
                    item = reader.next()
                except StopIteration:
                    break
                pair = item if self.key_value_fn is None else self.key_value_fn(item)
                if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                    raise TypeError(
                        f"to_map_datapipe() needs (key, value) pairs, got {type(pair).__name__} "
                        f"{pair!r:.60}; pass key_value_fn=lambda item: (key, value)"
                    )
                key, value = pair
                if key in table:
                    duplicates.append(key)
                table[key] = value
            reader.close()
            if duplicates:
                warnings.warn(
                    f"to_map_datapipe(): {len(duplicates)} keys appear more than once (first: "
                    f"{duplicates[0]!r}); each keeps its last value",
                    UserWarning,
                    stacklevel=4,
                )
            self._table = table
        return self._table

    def __getitem__(self, key: Any) -> Any:
        table = self._load()
        try:
            return table[key]
        except KeyError:
            raise KeyError(f"to_map_datapipe(): no item has the key {key!r}") from None

    def __len__(self) -> int:
        return len(self._load())

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_table"] = None  # a copy reads the stream where it runs
        return state

    def __repr__(self) -> str:
        fn = None if self.key_value_fn is None else fn_name(self.key_value_fn)
        return f"IterToMapConverter(key_value_fn={fn})"
