"""How much memory an item holds: the measure ``in_memory_cache(size=...)`` bounds.

An item's memory is its Python objects plus the *buffers* they keep alive: a
tensor keeps its whole storage (a view ``x[:1]`` of a big tensor keeps all of
it), an array the memory at the end of its ``.base`` chain, a memoryview what
it was taken of, ``bytes``/``bytearray`` their data. One buffer shared by
several items (rows of one tensor, views of one array) is one memory, so a
:class:`BufferLedger` counts each buffer once among the items it holds.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

__all__ = ["BufferLedger", "ItemMemory", "item_memory", "item_nbytes"]

_MAX_DEPTH = 32

ItemMemory = tuple[int, dict[Any, int]]
"""``(object bytes, {buffer key: buffer bytes})`` of one item."""


def item_memory(item: Any) -> ItemMemory:
    """The bytes of ``item``'s own objects, and each buffer it keeps alive (by a key)."""
    buffers: dict[Any, int] = {}
    return _walk(item, buffers, 0), buffers


def item_nbytes(item: Any) -> int:
    """About how many bytes ``item`` holds: its objects and the buffers they keep alive.

    >>> item_nbytes({"x": bytes(1000)}) >= 1000
    True
    >>> item_nbytes(memoryview(bytearray(4096))) >= 4096
    True
    """
    own, buffers = item_memory(item)
    return own + sum(buffers.values())


def _walk(item: Any, buffers: dict[Any, int], depth: int) -> int:
    """The bytes of ``item``'s objects; its buffers are added to ``buffers``."""
    if isinstance(item, torch.Tensor):
        _tensor(item, buffers)
        return 64
    if isinstance(item, np.ndarray):
        _array(item, buffers)
        return 112
    if isinstance(item, (bytes, bytearray)):
        buffers[("obj", id(item))] = sys.getsizeof(item)
        return 0
    if isinstance(item, memoryview):
        _exporter(item.obj, item.nbytes, buffers)
        return sys.getsizeof(item)
    if isinstance(item, (str, int, float, bool)) or item is None or depth > _MAX_DEPTH:
        return sys.getsizeof(item)
    size = sys.getsizeof(item)
    if isinstance(item, (list, tuple, set, frozenset)):
        return size + sum(_walk(x, buffers, depth + 1) for x in item)
    if isinstance(item, dict):
        return size + sum(
            _walk(k, buffers, depth + 1) + _walk(v, buffers, depth + 1) for k, v in item.items()
        )
    if type(item).__module__.startswith("PIL.") and hasattr(item, "getbands"):
        width, height = item.size
        return width * height * len(item.getbands()) + 200
    state = getattr(item, "__dict__", None)
    if state:
        size += _walk(state, buffers, depth + 1)
    return size + sum(_walk(value, buffers, depth + 1) for value in _slot_values(item))


def _slot_values(item: Any) -> Iterator[Any]:
    """The values of ``item``'s ``__slots__`` attributes (a ``dataclass(slots=True)``)."""
    for cls in type(item).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__"):
                try:
                    yield getattr(item, name)
                except AttributeError:  # an unset slot
                    pass


def _tensor(tensor: torch.Tensor, buffers: dict[Any, int]) -> None:
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        buffers[("obj", id(tensor))] = tensor.element_size() * tensor.numel()
        return
    key = ("storage", str(storage.device), storage.data_ptr())
    buffers[key] = max(buffers.get(key, 0), storage.nbytes())


def _array(array: np.ndarray, buffers: dict[Any, int]) -> None:
    owner = array
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    base = owner.base
    if base is None:  # the array owns its memory
        buffers[("obj", id(owner))] = int(owner.nbytes)
    elif isinstance(base, (bytes, bytearray, memoryview)):
        _walk(base, buffers, _MAX_DEPTH)
    else:  # a mapping, a tensor's storage, a foreign exporter: count what the array spans
        key = ("obj", id(base))
        buffers[key] = max(buffers.get(key, 0), int(owner.nbytes))


def _exporter(obj: Any, viewed: int, buffers: dict[Any, int]) -> None:
    """What a memoryview keeps alive: the object it was taken of (``viewed``: its bytes seen)."""
    if isinstance(obj, (bytes, bytearray, np.ndarray, torch.Tensor)):
        _walk(obj, buffers, _MAX_DEPTH)
        return
    key = ("obj", id(obj))
    buffers[key] = max(buffers.get(key, 0), viewed)


class BufferLedger:
    """The bytes of a set of items, each buffer counted once however many items keep it.

    Keys are object ids and addresses, unique while the objects live, which the
    holder of the items guarantees by holding them until it calls :meth:`remove`.
    """

    def __init__(self) -> None:
        self._users: dict[Any, list[int]] = {}  # buffer key -> [items using it, bytes]
        self.nbytes = 0

    def add(self, memory: ItemMemory) -> None:
        own, buffers = memory
        self.nbytes += own
        for key, size in buffers.items():
            entry = self._users.get(key)
            if entry is None:
                self._users[key] = [1, size]
                self.nbytes += size
            else:
                entry[0] += 1
                if size > entry[1]:  # a wider view of a foreign exporter
                    self.nbytes += size - entry[1]
                    entry[1] = size

    def remove(self, memory: ItemMemory) -> None:
        own, buffers = memory
        self.nbytes -= own
        for key in buffers:
            entry = self._users[key]
            entry[0] -= 1
            if not entry[0]:
                del self._users[key]
                self.nbytes -= entry[1]
