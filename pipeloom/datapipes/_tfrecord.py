"""``load_from_tfrecord``: TFRecord files of ``tf.train.Example`` / ``SequenceExample`` records.

A TFRecord file is a sequence of records, each framed as a little-endian
``uint64`` length, a masked CRC-32C of the length, the data, and a masked
CRC-32C of the data. Both are verified by default: a corrupted frame or a
changed byte of a record fails, naming the file and the record, never a
silently different feature. ``verify_data=False`` skips the data's checksum
(CRC-32C is computed with NumPy here, ~100-200 MB/s for large records, far
less for small ones). A damaged record's protobuf raises ``ValueError`` too.

Records are parsed from the protobuf wire format directly (no dependency on
``protobuf``): an ``Example``'s ``features`` and a ``SequenceExample``'s
``context`` and ``feature_lists``. A feature comes out as torchdata 0.9 gave
it: ``bytes_list`` as a list of ``bytes``, ``float_list`` as a ``float32``
tensor, ``int64_list`` as an ``int64`` tensor; a feature list as a list of
those (stacked when the spec gives a dtype).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from typing import IO, Any

import numpy as np
import torch

from ._base import IterDataPipe
from ._crc32c import SMALL_INPUT, crc32c, crc32c_many, mask, masked_crc32c
from ._decompress import check_length
from ._files import StreamReader

__all__ = ["TFRecordLoader", "crc32c", "masked_crc32c"]

Spec = dict[str, tuple[Any, Any]]


# -- protobuf wire format ------------------------------------------------------------------


def _varint(buffer: memoryview, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(buffer):
            raise ValueError("a varint runs past the end of the message")
        byte = buffer[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if shift == 63 and byte > 1:
                raise ValueError("a varint is larger than 64 bits")
            return value, position
        shift += 7
        if shift > 63:
            raise ValueError("a varint is longer than 10 bytes")


def _message(wire: int, value: Any, what: str) -> memoryview:
    """``value`` if it is a length-delimited field (a nested message or packed list)."""
    if wire != 2:
        raise ValueError(f"{what} has wire type {wire}, expected 2 (length-delimited)")
    return value


def _fields(buffer: memoryview) -> Iterator[tuple[int, int, Any]]:
    """``(field number, wire type, value)`` of each field; nested messages as memoryviews."""
    position = 0
    while position < len(buffer):
        key, position = _varint(buffer, position)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, position = _varint(buffer, position)
        elif wire == 1 or wire == 5:
            width = 8 if wire == 1 else 4
            if position + width > len(buffer):
                raise ValueError("a fixed-width field runs past the end of the message")
            value, position = buffer[position : position + width], position + width
        elif wire == 2:
            size, position = _varint(buffer, position)
            if position + size > len(buffer):
                raise ValueError("a field runs past the end of the message")
            value, position = buffer[position : position + size], position + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _feature(buffer: memoryview, name: str) -> Any:
    value: Any = None
    for number, wire, data in _fields(buffer):
        if number in (1, 2, 3):
            data = _message(wire, data, f"feature {name!r}")
        if number == 1:  # bytes_list
            value = [
                bytes(_message(w, v, f"feature {name!r}")) for n, w, v in _fields(data) if n == 1
            ]
        elif number == 2:  # float_list
            floats: list[float] = []
            for n, w, v in _fields(data):
                if n == 1 and w == 2:
                    floats.extend(np.frombuffer(v, dtype="<f4").tolist())
                elif n == 1 and w == 5:
                    floats.append(struct.unpack("<f", v)[0])
            value = torch.tensor(floats, dtype=torch.float32)
        elif number == 3:  # int64_list
            ints: list[int] = []
            for n, w, v in _fields(data):
                if n == 1 and w == 2:
                    position = 0
                    while position < len(v):
                        raw, position = _varint(v, position)
                        ints.append(_int64(raw))
                elif n == 1 and w == 0:
                    ints.append(_int64(v))
            value = torch.tensor(ints, dtype=torch.int64)
    if value is None:
        raise ValueError(f"feature {name!r} has no value (no bytes, float or int64 list)")
    return value


def _map_entries(buffer: memoryview) -> Iterator[tuple[str, memoryview]]:
    for number, wire, entry in _fields(buffer):
        if number != 1:
            continue
        key, value = "", memoryview(b"")
        for n, w, v in _fields(_message(wire, entry, "a map entry")):
            if n == 1:
                key = bytes(_message(w, v, "a feature name")).decode("utf-8")
            elif n == 2:
                value = _message(w, v, f"feature {key!r}")
        yield key, value


def _reshape_list(values: list[Any], shape: Any) -> Any:
    flat: list[Any] = []

    def walk(value: Any) -> None:
        if isinstance(value, (bytes, str)):
            flat.append(value)
        else:
            for element in value:
                walk(element)

    walk(values)
    dims = list(shape)
    if sum(1 for d in dims if d == -1) > 1:
        raise ValueError(f"a shape has at most one -1, got {shape}")
    known = math.prod(d for d in dims if d != -1)
    if len(flat) % max(known, 1):
        raise ValueError(f"cannot reshape {len(flat)} values into shape {shape}")
    dims = [len(flat) // max(known, 1) if d == -1 else d for d in dims]

    def build(values: list[Any], dims: list[int]) -> Any:
        if not dims:
            if len(values) != 1:
                raise ValueError(f"cannot reshape {len(flat)} values into shape {shape}")
            return values[0]
        if len(dims) == 1:
            if len(values) != dims[0]:
                raise ValueError(f"cannot reshape {len(flat)} values into shape {shape}")
            return values
        step = len(values) // dims[0]
        return [build(values[i * step : (i + 1) * step], dims[1:]) for i in range(dims[0])]

    return build(flat, dims)


def _apply_spec(value: Any, spec: tuple[Any, Any] | None) -> Any:
    if spec is None:
        return value
    shape, dtype = spec
    if isinstance(dtype, torch.dtype):
        if shape is not None:
            value = value.reshape(shape)
        return value.to(dtype)
    if shape is not None:
        return _reshape_list(value, shape)
    return value


def parse_record(record: memoryview, spec: Spec | None) -> dict[str, Any]:
    """An ``Example`` or ``SequenceExample`` record as a dict of features."""
    result: dict[str, Any] = {}
    sequences: dict[str, list[Any]] = {}
    for number, wire, message in _fields(record):
        if number in (1, 2):
            message = _message(wire, message, "the record's features")
        if number == 1:  # Example.features / SequenceExample.context
            for key, feature in _map_entries(message):
                if spec is None or key in spec:
                    result[key] = _feature(feature, key)
        elif number == 2:  # SequenceExample.feature_lists
            for key, feature_list in _map_entries(message):
                if spec is None or key in spec:
                    sequences[key] = [
                        _feature(_message(w, f, f"feature list {key!r}"), key)
                        for n, w, f in _fields(feature_list)
                        if n == 1
                    ]
    out = {
        key: _apply_spec(value, None if spec is None else spec[key])
        for key, value in result.items()
    }
    for key, values in sequences.items():
        if key in out:
            raise ValueError(f"feature {key!r} is both in the context and in the feature lists")
        feature_spec = None if spec is None else spec[key]
        value: Any = values
        if feature_spec is not None and isinstance(feature_spec[1], torch.dtype):
            value = torch.stack(values, 0)
        out[key] = _apply_spec(value, feature_spec)
    if spec is not None and set(out) != set(spec):
        raise ValueError(f"the record lacks features {sorted(set(spec) - set(out))} of the spec")
    return out


_PIECE = 16 << 20


def _read_exactly(stream: IO[Any], size: int) -> bytes:
    """``size`` bytes, fewer only at the end of the stream.

    A raw stream (a pipe, a socket, ``open(..., buffering=0)``) may return
    fewer bytes than asked before its end, so reads go on until the end. Large
    sizes are read in 16 MiB pieces: a huge length never allocates more than the
    data really there (``read(2**40)`` would raise MemoryError before reading).
    """
    first = stream.read(size) if size <= _PIECE else b""
    if len(first) == size:
        return first
    pieces = [first]
    left = size - len(first)
    while left:
        piece = stream.read(min(left, _PIECE))
        if not piece:
            break
        pieces.append(piece)
        left -= len(piece)
    return b"".join(pieces)


def _where(path: str, index: int) -> str:
    return f"TFRecord file {path!r}, record {index}"


_BATCH_RECORDS = 1024  # frames read ahead, at most ...
_BATCH_BYTES = 8 << 20  # ... and about this many bytes


def _read_frames(
    stream: IO[Any], path: str, index: int, ahead: int
) -> tuple[list[tuple[bytes, int]], Any]:
    """Up to ``ahead`` next frames ``(data, stored masked CRC)`` and the error that stopped them.

    Reading ahead stops after ``_BATCH_BYTES`` or a large record (whose CRC
    runs on its own). An empty list and None: the end of the file.
    """
    frames: list[tuple[bytes, int]] = []
    total = 0
    while len(frames) < ahead and total < _BATCH_BYTES:
        record = index + len(frames)
        head = _read_exactly(stream, 8)
        if not head:
            break
        if len(head) != 8:
            return frames, ValueError(
                f"{_where(path, record)}: the file ends inside a record's length"
            )
        checksum = _read_exactly(stream, 4)
        if len(checksum) != 4:
            return frames, ValueError(
                f"{_where(path, record)}: the file ends inside a record's length checksum"
            )
        if struct.unpack("<I", checksum)[0] != masked_crc32c(head):
            return frames, ValueError(
                f"{_where(path, record)}: the length's checksum is wrong: corrupted data"
            )
        (size,) = struct.unpack("<Q", head)
        data = _read_exactly(stream, size)
        footer = _read_exactly(stream, 4)
        if len(data) != size or len(footer) != 4:
            return frames, ValueError(
                f"{_where(path, record)}: the file ends inside the record ({size} bytes)"
            )
        frames.append((data, struct.unpack("<I", footer)[0]))
        total += size
        if size >= SMALL_INPUT:
            break
    return frames, None


class TFRecordLoader(StreamReader):
    """Yield each record of each TFRecord stream as a dict of features.

    Functional: ``load_from_tfrecord``. See the module docstring for the
    format and the values.

    Args:
        source: a block yielding ``(path, binary stream)``.
        spec: feature name -> ``(shape, dtype)``: only these features are kept
            (a missing one is an error); tensors are reshaped and cast, bytes
            lists nested to ``shape`` (with ``dtype`` None).
        length: the value of ``len()`` (``-1``: no length).
        verify_data: check each record's data checksum (default; False skips
            it, and a changed data byte then comes out as a changed feature).

    Raises (while iterating):
        ValueError: a truncated or corrupted record, naming the file and the
            record's index.

    Example:
        >>> import io, struct
        >>> record = bytes.fromhex("0a0d0a0b0a017812061a040a020102")  # {"x": int64 [1, 2]}
        >>> head = struct.pack("<Q", len(record))
        >>> frame = head + struct.pack("<I", masked_crc32c(head)) + record
        >>> frame += struct.pack("<I", masked_crc32c(record))
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper([("a.tfrecord", io.BytesIO(frame))]).load_from_tfrecord())
        [{'x': tensor([1, 2])}]
    """

    def __init__(
        self,
        source: IterDataPipe,
        spec: Spec | None = None,
        length: int = -1,
        *,
        verify_data: bool = True,
    ) -> None:
        super().__init__(source)
        if spec is not None and not isinstance(spec, dict):
            raise TypeError(f"spec must be a dict of name -> (shape, dtype), got {spec!r}")
        self.spec = spec
        self.length = check_length(length)
        self.verify_data = bool(verify_data)

    def _read(self, path: str, stream: IO[Any], skip: int) -> Iterator[dict[str, Any]]:
        index = 0
        while True:
            # Frames are read a batch ahead so that their data checksums run at once;
            # a record is yielded only after its own checksum, in file order, and a
            # damaged frame raises after the good records before it, as one by one.
            ahead = _BATCH_RECORDS if self.verify_data else 1
            frames, failure = _read_frames(stream, path, index, ahead)
            checked = len(frames)
            if self.verify_data and frames:
                crcs = crc32c_many([data for data, _ in frames])
                checked = next(
                    (
                        i
                        for i, (crc, (_, stored)) in enumerate(zip(crcs, frames))
                        if mask(crc) != stored
                    ),
                    len(frames),
                )
            for data, _ in frames[:checked]:
                if index >= skip:
                    try:
                        yield parse_record(memoryview(data), self.spec)
                    except ValueError as error:
                        raise ValueError(
                            f"TFRecord file {path!r}, record {index}: {error}"
                        ) from None
                index += 1
            if checked < len(frames):
                raise ValueError(
                    f"TFRecord file {path!r}, record {index}: the data's checksum is wrong: "
                    f"corrupted data"
                )
            if failure is not None:
                raise failure
            if not frames:
                return

    def __len__(self) -> int:
        if self.length == -1:
            raise TypeError(
                "TFRecordLoader has no length unless given one; pass load_from_tfrecord(length=N)"
            )
        return self.length

    def __repr__(self) -> str:
        spec = None if self.spec is None else sorted(self.spec)
        return f"TFRecordLoader(spec={spec}, verify_data={self.verify_data})"
