"""Turning items into bytes plus out-of-band buffers, and back.

Pickle protocol 5 with out-of-band buffers (PEP 574): tensors and arrays are
reduced to a small description plus a ``PickleBuffer`` over their memory, which
the process queue copies straight into shared memory (one copy, no pipe). On
the other side ``pickle.loads(stream, buffers=...)`` hands the rebuild
functions views of the shared memory, so tensors and arrays are built over it
with no copy. Lambdas and local functions fall back to cloudpickle (needed
under ``spawn``/``forkserver``).

Tensors that require grad are rejected: autograd history cannot cross a
process boundary, and silently detaching would hide that. Call ``.detach()``.
"""

from __future__ import annotations

import copyreg
import io
import pickle
from collections import ChainMap
from typing import Any

import cloudpickle
import numpy as np
import torch

from pipeloom.queues._sharing import Scan, current, shared_array, shared_tensor

__all__ = ["INBAND_MAX", "PayloadError", "decode", "encode"]

INBAND_MAX = 8 * 1024
"""Buffers smaller than this stay in the pickle stream (shm costs more)."""

_ATOMS = frozenset({int, float, str, bool, type(None), complex})
_CONTAINERS = (tuple, list)


class PayloadError(TypeError):
    """An item holds something that cannot cross the queue as is."""


def _is_plain(item: Any) -> bool:
    """True for small trees of builtin atoms, which plain ``pickle.dumps`` handles best."""
    kind = type(item)
    if kind in _ATOMS or (kind is bytes and len(item) < INBAND_MAX):
        return True
    if kind in _CONTAINERS and len(item) <= 8:
        return all(type(x) in _ATOMS for x in item)
    return False


def _rebuild_ndarray(buffer: Any, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


def _reduce_ndarray(array: np.ndarray) -> Any:
    if array.dtype.hasobject or array.dtype.itemsize == 0:  # no raw bytes to share
        return array.__reduce_ex__(5)
    scan = current.scan
    if scan is not None:
        if scan.blocks is None:
            scan.note_array(array)
        elif (shared := shared_array(scan, array)) is not None:
            return shared
    if not array.flags.c_contiguous:
        array = array.copy(order="C")
    # NumPy refuses a buffer of datetime64/timedelta64 arrays: those go as their bytes.
    raw = array.reshape(-1).view(np.uint8) if array.dtype.kind in "Mm" else array
    return _rebuild_ndarray, (pickle.PickleBuffer(raw), array.dtype, array.shape)  # type: ignore[arg-type]


def _rebuild_tensor(buffer: Any, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    view = memoryview(buffer)
    if view.nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    if view.readonly:  # torch warns on read-only buffers; give it a private copy
        buffer = bytearray(view)
    return torch.frombuffer(buffer, dtype=dtype).view(shape)


def _reduce_tensor(tensor: torch.Tensor) -> Any:
    if tensor.requires_grad:
        raise PayloadError(
            f"cannot send a tensor that requires grad (shape {tuple(tensor.shape)}, "
            f"{tensor.dtype}): autograd history cannot cross a process boundary; "
            "send tensor.detach() instead"
        )
    if (
        tensor.layout != torch.strided
        or tensor.device.type != "cpu"
        or tensor.is_quantized
        or tensor.is_nested  # strided layout, but no single block of memory
    ):
        return tensor.__reduce_ex__(5)  # torch's own pickling, by copy
    scan = current.scan
    if scan is not None:
        if scan.blocks is None:
            scan.note_tensor(tensor)
        elif (shared := shared_tensor(scan, tensor)) is not None:
            return shared
    flat = tensor.resolve_conj().resolve_neg().contiguous().reshape(-1)
    if flat.numel() == 1:  # "contiguous" whatever its stride (m[1:2, 0]); bytes need stride 1
        flat = flat.as_strided((1,), (1,))
    raw = flat.view(torch.uint8).numpy()
    return _rebuild_tensor, (pickle.PickleBuffer(raw), tensor.dtype, tuple(tensor.shape))  # type: ignore[arg-type]


_CASTABLE = frozenset("cbBhHiIlLqQnNfd?P")  # the formats memoryview.cast makes


def _rebuild_memoryview(
    buffer: Any, cast: str | None, dtype: np.dtype | None, shape: tuple[int, ...], readonly: bool
) -> memoryview:
    view = memoryview(buffer)
    if view.readonly and not readonly:  # sent as bytes in the stream: a writable copy
        view = memoryview(bytearray(view))
    if cast is not None and 0 not in shape:
        view = view.cast("B").cast(cast, shape)  # type: ignore[call-overload]
    else:  # a format memoryview.cast refuses (byte order, structs), or no items: NumPy
        array = np.frombuffer(view, dtype=dtype or np.dtype(cast)).reshape(shape)
        view = memoryview(array)  # type: ignore[arg-type]
    return view.toreadonly() if readonly else view


def _reduce_memoryview(view: memoryview) -> Any:
    """A memoryview arrives as a memoryview: same format, shape and contents (C order),
    read-only if it was; its bytes travel like an array's (shared memory when big)."""
    fmt = view.format
    cast: str | None = fmt.removeprefix("@")
    dtype = None
    if cast not in _CASTABLE:
        cast = None
        try:
            dtype = np.asarray(view).dtype
        except (TypeError, ValueError) as err:
            raise PayloadError(
                f"cannot send a memoryview of format {fmt!r}: neither memoryview.cast nor "
                f"NumPy can rebuild it ({err}); send bytes(view), or a NumPy array"
            ) from err
    raw = view if view.c_contiguous else memoryview(view.tobytes())
    return _rebuild_memoryview, (
        pickle.PickleBuffer(raw),
        cast,
        dtype,
        view.shape,
        view.readonly,
    )


_REDUCERS = {
    np.ndarray: _reduce_ndarray,
    torch.Tensor: _reduce_tensor,
    memoryview: _reduce_memoryview,
}


class _Pickler(pickle.Pickler):
    dispatch_table = ChainMap(_REDUCERS, copyreg.dispatch_table)  # type: ignore[arg-type]


class _CloudPickler(cloudpickle.Pickler):
    dispatch_table = ChainMap(_REDUCERS, cloudpickle.Pickler.dispatch_table)


def encode(item: Any) -> tuple[bytes, list[memoryview]]:
    """Pickle ``item``; return the stream and its out-of-band buffers (raw bytes).

    Raises:
        TypeError: the item cannot be pickled, even with cloudpickle; the
            message names the item's type and the reason.
    """
    if _is_plain(item):
        return pickle.dumps(item, protocol=5), []
    try:
        return _dump(_Pickler, item)
    except PayloadError:
        raise
    except (pickle.PicklingError, AttributeError, TypeError) as first:
        try:
            return _dump(_CloudPickler, item)
        except PayloadError:
            raise
        except Exception as second:  # noqa: BLE001 - any failure is reported at put()
            raise TypeError(
                f"cannot send an item of type {type(item).__qualname__!r}: it is not "
                f"picklable ({first}; cloudpickle: {second}). Items that cross between "
                "processes must be picklable: convert or drop the offending object "
                "before it is sent (e.g. in a .map() in the worker)"
            ) from second
    except RecursionError as err:
        raise TypeError(
            f"cannot send an item of type {type(item).__qualname__!r}: it is too deeply "
            "nested to pickle"
        ) from err


def _dump(pickler_type: type[pickle.Pickler], item: Any) -> tuple[bytes, list[memoryview]]:
    current.scan = scan = Scan()
    try:
        stream, buffers = _dump_once(pickler_type, item)
        if scan.groups:  # views of one memory: again, each memory's bytes sent once
            scan.share()
            stream, buffers = _dump_once(pickler_type, item)
    finally:
        current.scan = None
    return stream, buffers


def _dump_once(pickler_type: type[pickle.Pickler], item: Any) -> tuple[bytes, list[memoryview]]:
    buffers: list[memoryview] = []

    def keep_out_of_band(buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        if raw.nbytes < INBAND_MAX:
            return True
        buffers.append(raw)
        return False

    stream = io.BytesIO()
    pickler_type(stream, protocol=5, buffer_callback=keep_out_of_band).dump(item)
    return stream.getvalue(), buffers


def decode(stream: Any, buffers: list[memoryview]) -> Any:
    """Rebuild an item from :func:`encode`'s output (buffers may be shm views)."""
    return pickle.loads(stream, buffers=buffers)
