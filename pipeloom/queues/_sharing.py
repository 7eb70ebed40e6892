"""Tensors and arrays of one item that share memory arrive sharing memory.

Two views of one storage (``(x[:n], x[n:])``, ``a`` and ``a.T``) put in one
item would otherwise travel as two copies: twice the bytes, and a write to
one would no longer show in the other (``torch.multiprocessing`` keeps them
sharing). So the pickler notes the memory each tensor or array lies in
(:class:`Scan`); only if one memory was seen twice is the item pickled again,
sharing: the span of that memory its views use travels once, as a block the
pickle memo refers to from every view, and each view is rebuilt over the
received block with its own offset, shape and strides (so strided views stay
strided). The common case, no memory seen twice, costs a dict entry per
tensor or array.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import numpy as np
import torch
from numpy.lib.array_utils import byte_bounds

__all__ = ["Scan", "current", "shared_array", "shared_tensor"]

_ALIGN = 16  # a multiple of every itemsize: a view of another dtype lines up in the block


class Scan:
    """The tensors and arrays of the item being pickled, by the memory they lie in.

    The first pass notes each one (:meth:`note_tensor`, :meth:`note_array`:
    the first of a memory by itself, the rest in :attr:`groups`); if a memory
    was seen twice, :meth:`share` makes one block per such memory for the
    second pass.
    """

    def __init__(self) -> None:
        self.tensors: dict[int, torch.Tensor] = {}  # storage address -> first tensor
        self.arrays: dict[int, np.ndarray] = {}  # id of the memory's owner -> first array
        self.groups: dict[tuple[str, int], list[Any]] = {}  # memories seen twice or more
        self.blocks: dict[tuple[str, int], _Block] | None = None  # in the second pass

    def note_tensor(self, tensor: torch.Tensor) -> None:
        address = tensor.untyped_storage().data_ptr()
        first = self.tensors.setdefault(address, tensor)
        if first is not tensor and address:  # (address 0: no bytes, nothing to share)
            self.groups.setdefault(("tensor", address), [first]).append(tensor)

    def note_array(self, array: np.ndarray) -> None:
        owner = array if array.base is None else _owner(array)
        first = self.arrays.setdefault(id(owner), array)
        if first is not array:
            self.groups.setdefault(("array", id(owner)), [first]).append(array)

    def share(self) -> None:
        """Prepare the second pass: a block per memory seen more than once."""
        self.blocks = {}
        for key, views in self.groups.items():
            if key[0] == "tensor":
                views = [view for view in views if view.numel()]
            else:
                views = [view for view in views if view.size]
            if len(views) > 1:  # (empty views share nothing)
                self.blocks[key] = (_tensor_block if key[0] == "tensor" else _array_block)(views)


class _Current(threading.local):
    scan: Scan | None = None


current = _Current()
"""``current.scan``: the :class:`Scan` of the item this thread is pickling, or None."""


def _owner(array: np.ndarray) -> Any:
    """What owns the memory ``array`` is a view of (an array, or a bytes-like object)."""
    owner: Any = array
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    return owner


def shared_tensor(scan: Scan, tensor: torch.Tensor) -> Any:
    """In the second pass, the reduction of a tensor over its block, or None."""
    if tensor.numel() == 0 or tensor.is_conj() or tensor.is_neg():
        return None  # (no bytes to share; those bits are resolved by copying)
    block = scan.blocks.get(("tensor", tensor.untyped_storage().data_ptr()))  # type: ignore[union-attr]
    if block is None:
        return None
    first = tensor.storage_offset() * tensor.element_size()
    return _rebuild_tensor_view, (
        block,
        tensor.dtype,
        tuple(tensor.shape),
        tuple(tensor.stride()),
        (first - block.low) // tensor.element_size(),
    )


def shared_array(scan: Scan, array: np.ndarray) -> Any:
    """In the second pass, the reduction of an array over its block, or None."""
    if array.size == 0:
        return None
    block = scan.blocks.get(("array", id(_owner(array))))  # type: ignore[union-attr]
    if block is None:
        return None
    return _rebuild_array_view, (
        block,
        array.dtype,
        array.shape,
        array.strides,
        array.__array_interface__["data"][0] - block.low,
    )


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    size = tensor.element_size()
    first = tensor.storage_offset() * size
    extent = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True))
    return int(first), int(first + extent * size)


def _tensor_block(views: list[torch.Tensor]) -> _Block:
    spans = [_span(view) for view in views]
    low = min(first for first, _ in spans)
    low -= low % _ALIGN
    high = max(end for _, end in spans)
    raw = torch.empty(0, dtype=torch.uint8)
    raw.set_(views[0].untyped_storage(), low, (high - low,), (1,))
    return _Block(low, raw.numpy())


class _Interface:
    """An ``__array_interface__`` holder: NumPy makes an array of any memory from it."""

    def __init__(self, interface: dict, base: Any) -> None:
        self.__array_interface__ = interface
        self.base = base


def _array_block(views: list[np.ndarray]) -> _Block:
    bounds = [byte_bounds(view) for view in views]
    low, high = min(lo for lo, _ in bounds), max(hi for _, hi in bounds)
    interface = {"data": (low, True), "shape": (high - low,), "typestr": "|u1", "version": 3}
    return _Block(low, np.asarray(_Interface(interface, views[0])))


class _Block:
    """The span of one memory that an item's views use; pickled once (the memo)."""

    def __init__(self, low: int, memory: np.ndarray) -> None:
        self.low = low
        self.memory = memory

    def __reduce__(self) -> Any:
        return _ReceivedBlock, (pickle.PickleBuffer(self.memory),)  # type: ignore[arg-type]


class _ReceivedBlock:
    """The received span, as a uint8 array and tensor over the buffer."""

    def __init__(self, buffer: Any) -> None:
        if memoryview(buffer).readonly:  # came in the pickle stream (small): a writable copy
            buffer = bytearray(buffer)
        self.array = np.frombuffer(buffer, np.uint8)
        self.tensor = torch.from_numpy(self.array)


def _rebuild_tensor_view(
    block: _ReceivedBlock,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    offset: int,
) -> torch.Tensor:
    raw = block.tensor
    whole = raw[: raw.numel() - raw.numel() % dtype.itemsize].view(dtype)
    return torch.as_strided(whole, shape, stride, offset)


def _rebuild_array_view(
    block: _ReceivedBlock,
    dtype: np.dtype,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    at: int,
) -> np.ndarray:
    start = block.array[at : at + dtype.itemsize].view(dtype)
    return np.lib.stride_tricks.as_strided(start, shape, strides)
