"""Joining two streams by key: ``zip_with_iter`` and ``zip_with_map``."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ._base import IterDataPipe, MapDataPipe
from ._context import current_stamp, restore_stamp
from ._map import check_callable, fn_name

__all__ = ["IterKeyZipper", "MapKeyZipper"]


def _merge(merge_fn: Callable[[Any, Any], Any] | None, item: Any, match: Any) -> Any:
    return (item, match) if merge_fn is None else merge_fn(item, match)


def _check_fn(fn: Any, name: str, owner: str, nargs: int, optional: bool) -> None:
    if fn is None and optional:
        return
    check_callable(fn, name, owner, nargs)


class IterKeyZipper(IterDataPipe):
    """Pair each item with the item of ``ref_datapipe`` that has the same key.

    Functional: ``zip_with_iter``. The output follows ``source``'s order;
    ``ref_datapipe`` is read ahead as far as needed, the unmatched items
    waiting in a buffer. When the buffer holds more than ``buffer_size``
    items its oldest one is dropped, with one warning per epoch.

    Args:
        source: the stream whose order the output follows.
        ref_datapipe: the stream to find matches in.
        key_fn: the key of an item of ``source``.
        ref_key_fn: the key of an item of ``ref_datapipe`` (default ``key_fn``).
        keep_key: yield ``(key, merged)`` instead of ``merged``.
        buffer_size: how many unmatched reference items to keep; None: no limit.
        merge_fn: ``merge_fn(item, ref_item)``; default ``(item, ref_item)``.

    Raises (while iterating):
        BufferError: an item whose key the reference stream never gives.
        ValueError: two reference items with the same key.

    Example:
        >>> from operator import itemgetter
        >>> from pipeloom.datapipes import IterableWrapper
        >>> images = IterableWrapper([("b", "img-b"), ("a", "img-a")])
        >>> labels = IterableWrapper([("a", 0), ("b", 1), ("c", 2)])
        >>> list(images.zip_with_iter(labels, key_fn=itemgetter(0), keep_key=True,
        ...                           merge_fn=lambda x, y: (x[1], y[1])))
        [('b', ('img-b', 1)), ('a', ('img-a', 0))]
    """

    inputs = ("source", "ref_datapipe")

    def __init__(
        self,
        source: IterDataPipe,
        ref_datapipe: IterDataPipe,
        key_fn: Callable[[Any], Any],
        ref_key_fn: Callable[[Any], Any] | None = None,
        keep_key: bool = False,
        buffer_size: int | None = 10000,
        merge_fn: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        if not isinstance(ref_datapipe, IterDataPipe):
            hint = (
                "; use zip_with_map() for a MapDataPipe"
                if isinstance(ref_datapipe, MapDataPipe)
                else ""
            )
            raise TypeError(
                f"zip_with_iter() expects ref_datapipe to be an IterDataPipe, got "
                f"{type(ref_datapipe).__name__}{hint}"
            )
        _check_fn(key_fn, "key_fn", "zip_with_iter", 1, optional=False)
        _check_fn(ref_key_fn, "ref_key_fn", "zip_with_iter", 1, optional=True)
        _check_fn(merge_fn, "merge_fn", "zip_with_iter", 2, optional=True)
        if buffer_size is not None and (
            isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1
        ):
            raise ValueError(
                f"buffer_size must be an int >= 1 or None (no limit), got {buffer_size!r}"
            )
        self.source = source
        self.ref_datapipe = ref_datapipe
        self.key_fn = key_fn
        self.ref_key_fn = key_fn if ref_key_fn is None else ref_key_fn
        self.keep_key = bool(keep_key)
        self.buffer_size = buffer_size
        self.merge_fn = merge_fn
        self.reset()

    def reset(self) -> None:
        self._buffer: OrderedDict[Any, Any] = OrderedDict()
        self._pending: tuple[Any, Any, tuple] | None = None  # (item, key, stamp)
        self._warned = False

    def async_next(self) -> Any:
        if self._pending is None:
            item = self.source.async_next()
            self._pending = (item, self.key_fn(item), current_stamp())
        item, key, stamp = self._pending
        buffer = self._buffer
        while key not in buffer:
            try:
                ref_item = self.ref_datapipe.async_next()  # NotAvailable keeps the pending item
            except StopIteration:
                self._pending = None
                raise BufferError(
                    f"zip_with_iter(): the reference stream ended without an item of key "
                    f"{key!r} (for {item!r:.60}); check key_fn/ref_key_fn, or raise buffer_size "
                    f"({self.buffer_size}) if matches were dropped from a full buffer"
                ) from None
            self._store(self.ref_key_fn(ref_item), ref_item)
        self._pending = None
        merged = _merge(self.merge_fn, item, buffer.pop(key))
        restore_stamp(stamp)
        return (key, merged) if self.keep_key else merged

    def _store(self, ref_key: Any, ref_item: Any) -> None:
        buffer = self._buffer
        if ref_key in buffer:
            raise ValueError(
                f"zip_with_iter(): the reference stream has two items with key {ref_key!r}; "
                f"keys must be unique there"
            )
        if self.buffer_size is not None and len(buffer) > self.buffer_size:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"zip_with_iter(): more than buffer_size={self.buffer_size} reference items "
                    f"wait for a match; the oldest are dropped from now on. Raise buffer_size "
                    f"if they are needed later",
                    UserWarning,
                    stacklevel=4,
                )
            buffer.popitem(last=False)
        buffer[ref_key] = ref_item

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {
            "buffer": list(self._buffer.items()),
            "pending": self._pending,
            "warned": self._warned,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._buffer = OrderedDict(state["buffer"])
        pending = state["pending"]
        self._pending = None if pending is None else (pending[0], pending[1], tuple(pending[2]))
        self._warned = bool(state["warned"])

    def __repr__(self) -> str:
        return (
            f"IterKeyZipper(key_fn={fn_name(self.key_fn)}, ref_key_fn={fn_name(self.ref_key_fn)}, "
            f"keep_key={self.keep_key}, buffer_size={self.buffer_size})"
        )


class MapKeyZipper(IterDataPipe):
    """Pair each item with ``map_datapipe[key_fn(item)]`` (functional: ``zip_with_map``).

    Args:
        source: the stream to enrich.
        map_datapipe: a map-style block indexed by the keys.
        key_fn: the key (index) of an item.
        merge_fn: ``merge_fn(item, value)``; default ``(item, value)``.
        keep_key: yield ``(key, merged)`` instead of ``merged``.

    Raises (while iterating):
        KeyError: a key ``map_datapipe`` does not have, naming the item.

    Example:
        >>> from operator import itemgetter
        >>> from pipeloom.datapipes import IterableWrapper, SequenceWrapper
        >>> prices = SequenceWrapper({"a": 100, "b": 200})
        >>> orders = IterableWrapper([("a", 1), ("b", 2)])
        >>> list(orders.zip_with_map(prices, itemgetter(0), lambda o, p: (o[0], o[1] + p)))
        [('a', 101), ('b', 202)]
    """

    inputs = ("source", "map_datapipe")
    per_item = True
    one_to_one = True

    def __init__(
        self,
        source: IterDataPipe,
        map_datapipe: MapDataPipe,
        key_fn: Callable[[Any], Any],
        merge_fn: Callable[[Any, Any], Any] | None = None,
        keep_key: bool = False,
    ) -> None:
        if not isinstance(map_datapipe, MapDataPipe):
            hint = (
                "; use zip_with_iter() for an IterDataPipe"
                if isinstance(map_datapipe, IterDataPipe)
                else "; wrap it with SequenceWrapper(...)"
            )
            raise TypeError(
                f"zip_with_map() expects map_datapipe to be a MapDataPipe, got "
                f"{type(map_datapipe).__name__}{hint}"
            )
        _check_fn(key_fn, "key_fn", "zip_with_map", 1, optional=False)
        _check_fn(merge_fn, "merge_fn", "zip_with_map", 2, optional=True)
        self.source = source
        self.map_datapipe = map_datapipe
        self.key_fn = key_fn
        self.merge_fn = merge_fn
        self.keep_key = bool(keep_key)
        self._pending: tuple[Any, Any, tuple] | None = None

    def reset(self) -> None:
        self._pending = None

    def async_next(self) -> Any:
        if self._pending is None:
            item = self.source.async_next()
            self._pending = (item, self.key_fn(item), current_stamp())
        item, key, stamp = self._pending
        try:
            value = self.map_datapipe.async_get(key)  # NotAvailable keeps the pending item
        except (KeyError, IndexError):
            self._pending = None
            raise KeyError(
                f"zip_with_map(): key_fn maps {item!r:.60} to {key!r}, which map_datapipe "
                f"({self.map_datapipe!r:.60}) does not have"
            ) from None
        self._pending = None
        restore_stamp(stamp)  # the lookup may have stamped the map's index
        merged = _merge(self.merge_fn, item, value)
        return (key, merged) if self.keep_key else merged

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return f"MapKeyZipper(key_fn={fn_name(self.key_fn)}, keep_key={self.keep_key})"
