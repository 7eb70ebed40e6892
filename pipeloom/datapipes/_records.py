"""Record files: items stored compactly on disk, found again by position.

A *record* is one output of a block, with the key and draw count of its item
stamp: the position goes to the index, the rest of a multi-output key
(``j`` of ``(p, j)``: the ``j``-th sample of the tar shard at position ``p``)
to the record, so that a replayed item draws from ``item_rng()`` exactly as
the live item did. Writers append records to shard files of bounded size
(``<writer>-<n>.rec``) and, on close, an index (``index-<writer>.npy``: one
row of position, draws, file, offset, size, CRC-32 and stamp owner per record; the
owner is the upstream block whose epoch seed stamped the item, see
``_stamp_owners.py``). :func:`combine`
merges the writers' indexes, in position order, into the ``index.npy`` a
:class:`RecordReader` reads. The reader checks each record's CRC-32 before
unpickling it, so bytes changed on disk (a bad disk, a partial copy, an edit)
raise an error naming the record instead of coming back as a wrong item;
indexes written before the checksum (no ``crc`` column) are read unchecked.

Items are pickled with protocol 5; NumPy arrays and CPU tensors travel as
out-of-band buffers, written and read back without an extra copy (reading a
150 kB image tensor back is about 5x cheaper than pickling it in band and 6x
cheaper than ``torch.save``: ``benchmarks/bench_cache.py``, ``docs/caching.md``).

Example:
    >>> import tempfile, torch
    >>> folder = tempfile.mkdtemp()
    >>> writer = RecordWriter(folder, "w0", max_bytes=1 << 20)
    >>> writer.append(0, 0, {"x": torch.arange(3)})
    >>> writer.append((2, 0), 0, "two")
    >>> writer.append((2, 1), 0, "three")
    >>> writer.close()
    >>> combine(folder, ["w0"], sort=True)
    3
    >>> reader = RecordReader(folder)
    >>> reader.lookup(2), reader.read(2)
    ((1, 3), ((2, 1), 0, 'three'))
"""

from __future__ import annotations

import copyreg
import io
import os
import pickle
import struct
import weakref
import zlib
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np
import torch

from ._context import Key, key_position
from ._npy import load as load_npy

__all__ = ["RecordReader", "RecordWriter", "checksums", "combine", "damaged", "dumps", "loads"]

_UNCHECKED = [
    ("position", "<i8"),
    ("draws", "<i4"),
    ("file", "<i4"),
    ("offset", "<i8"),
    ("size", "<i8"),
]
INDEX_DTYPE = np.dtype([*_UNCHECKED, ("crc", "<u4"), ("owner", "<i2")])
UNOWNED_INDEX_DTYPE = np.dtype([*_UNCHECKED, ("crc", "<u4")])  # written before owners
UNCHECKED_INDEX_DTYPE = np.dtype(_UNCHECKED)  # written before records had a checksum
_HEAD = struct.Struct("<QI")  # pickle bytes, number of buffers
_ALIGN = 64
_NO_POSITION = -1  # an item without a position stamp


def damaged(directory: str, what: str) -> OSError:
    """The error for a snapshot directory whose files do not hold what they should."""
    return OSError(f"{what}; the snapshot is damaged: delete {directory} to rebuild it")


def _reduce_tensor(tensor: torch.Tensor) -> Any:
    if tensor.device.type != "cpu" or tensor.layout != torch.strided or tensor.requires_grad:
        return tensor.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    plain = tensor.resolve_conj().resolve_neg().contiguous()
    raw = plain.reshape(-1).view(torch.uint8).numpy() if plain.numel() else None
    buffer = None if raw is None else pickle.PickleBuffer(raw.data)
    return _rebuild_tensor, (buffer, str(plain.dtype).removeprefix("torch."), tuple(plain.shape))


def _rebuild_tensor(buffer: Any, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    kind = getattr(torch, dtype)
    if buffer is None:
        return torch.empty(shape, dtype=kind)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(kind).reshape(shape)


_DISPATCH = copyreg.dispatch_table.copy()
_DISPATCH[torch.Tensor] = _reduce_tensor


def dumps(item: Any) -> tuple[bytes, list[memoryview]]:
    """Pickle ``item``; arrays and tensors come back as separate buffers."""
    buffers: list[pickle.PickleBuffer] = []
    sink = io.BytesIO()
    pickler = pickle.Pickler(sink, protocol=5, buffer_callback=buffers.append)
    pickler.dispatch_table = _DISPATCH
    pickler.dump(item)
    return sink.getvalue(), [b.raw() for b in buffers]


def loads(data: Any, buffers: Sequence[Any]) -> Any:
    """Undo :func:`dumps` (``buffers`` should be writable, e.g. bytearray slices)."""
    return pickle.loads(data, buffers=buffers)


def _frame(item: Any) -> list[Any]:
    data, buffers = dumps(item)
    parts: list[Any] = [_HEAD.pack(len(data), len(buffers))]
    parts.append(struct.pack(f"<{len(buffers)}Q", *(b.nbytes for b in buffers)))
    parts.append(data)
    size = sum(len(p) for p in parts)
    for buffer in buffers:
        pad = -size % _ALIGN
        parts.append(bytes(pad))
        parts.append(buffer)
        size += pad + buffer.nbytes
    return parts


def _unframe(frame: memoryview) -> Any:
    length, count = _HEAD.unpack_from(frame)
    at = _HEAD.size
    sizes = struct.unpack_from(f"<{count}Q", frame, at)
    at += 8 * count
    data = frame[at : at + length]
    at += length
    buffers = []
    for size in sizes:
        at += -at % _ALIGN
        buffers.append(frame[at : at + size])
        at += size
    return loads(data, buffers)


class RecordWriter:
    """Append records to ``<name>-<n>.rec`` files of about ``max_bytes`` each in ``directory``.

    A record larger than ``max_bytes`` gets a file of its own.
    """

    def __init__(self, directory: str, name: str, max_bytes: int) -> None:
        self.directory = directory
        self.name = name
        self.max_bytes = max_bytes
        self._rows: list[tuple[int, int, int, int, int, int, int]] = []
        self._fd = -1
        self._file = -1
        self._offset = 0
        self.bytes_written = 0

    def append(self, key: Key | None, draws: int, item: Any, owner: int = -1) -> None:
        """Write one record; ``key`` is the item's (``p`` or ``(p, j, ...)``), None if none;
        ``owner`` the index of the block that stamped it (-1: unknown)."""
        position = key_position(key)
        parts = _frame((key[1:] if key.__class__ is tuple else None, item))  # type: ignore[index]
        size = sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts)
        if self._fd < 0 or (self._offset and self._offset + size > self.max_bytes):
            self._next_file()
        _write_all(self._fd, parts)
        crc = 0
        for part in parts:
            crc = zlib.crc32(part, crc)
        where = _NO_POSITION if position is None else position
        self._rows.append((where, draws, self._file, self._offset, size, crc, owner))
        self._offset += size
        self.bytes_written += size

    def _next_file(self) -> None:
        self._close_file()
        self._file += 1
        self._offset = 0
        path = os.path.join(self.directory, f"{self.name}-{self._file:05d}.rec")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def _close_file(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        """Flush the data to disk and write the index."""
        self._close_file()
        index = np.array(self._rows, dtype=INDEX_DTYPE)
        _save_array(os.path.join(self.directory, f"index-{self.name}.npy"), index)

    def abort(self) -> None:
        """Stop writing (the files stay for whoever removes the directory)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @property
    def count(self) -> int:
        return len(self._rows)


def _write_all(fd: int, parts: list[Any]) -> None:
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        done = os.writev(fd, views)
        while views and done >= len(views[0]):
            done -= len(views[0])
            views.pop(0)
        if views and done:
            views[0] = views[0][done:]


def _save_array(path: str, array: np.ndarray) -> None:
    with open(path, "wb") as file:
        np.save(file, array)
        file.flush()
        os.fsync(file.fileno())


def combine(directory: str, writers: Sequence[str], *, sort: bool) -> int:
    """Merge the writers' indexes into ``index.npy`` and ``files.txt``; return the record count.

    With ``sort`` the records are ordered by position (each writer's own
    order kept among equal positions), which is the order of the stream when
    writers held disjoint shards of it; otherwise the writers' order is kept.
    """
    parts: list[np.ndarray] = []
    files: list[str] = []
    for name in writers:
        index = load_npy(os.path.join(directory, f"index-{name}.npy"))
        count = int(index["file"].max()) + 1 if len(index) else 0
        index["file"] += len(files)
        files.extend(f"{name}-{k:05d}.rec" for k in range(count))
        parts.append(index)
    merged = np.concatenate(parts) if parts else np.zeros(0, dtype=INDEX_DTYPE)
    if sort:
        merged = merged[np.argsort(merged["position"], kind="stable")]
    _save_array(os.path.join(directory, "index.npy"), merged)
    with open(os.path.join(directory, "files.txt"), "w") as listing:
        listing.write("\n".join(files))
        listing.flush()
        os.fsync(listing.fileno())
    return len(merged)


def checksums(directory: str) -> dict[str, int]:
    """The CRC-32 of ``index.npy`` and ``files.txt`` (kept in the manifest from format 4)."""
    return {name: _file_crc(os.path.join(directory, name)) for name in _SEALED}


_SEALED = ("index.npy", "files.txt")


def _file_crc(path: str) -> int:
    crc = 0
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


class RecordReader:
    """Read records of a finished directory (see :func:`combine`) by number or position."""

    def __init__(
        self,
        directory: str,
        *,
        keyed: bool = True,
        records: int | None = None,
        checked: bool = False,
        sealed: dict[str, int] | None = None,
    ) -> None:
        """``checked``: the index must have checksums (else it may lack them: an older one).

        ``sealed``: the CRC-32 of ``index.npy`` and ``files.txt`` (see :func:`checksums`),
        checked before either is used; None for snapshots written without them.
        """
        self.directory = directory
        self.keyed = keyed  # False: written before records kept their key's rest (format 1)
        for name, crc in (sealed or {}).items():
            try:
                got = _file_crc(os.path.join(directory, name))
            except OSError as error:
                raise damaged(directory, f"its index cannot be read ({error})") from error
            if got != crc:
                raise damaged(
                    directory,
                    f"{name} is damaged: its CRC-32 is {got:#010x} where manifest.json says "
                    f"{crc:#010x} (its bytes changed since the snapshot was written)",
                )
        try:
            # A plain view of the mapped file (no np.memmap per-access overhead).
            self.index = np.asarray(load_npy(os.path.join(directory, "index.npy"), mmap_mode="r"))
            with open(os.path.join(directory, "files.txt")) as listing:
                self.files = [line for line in listing.read().split("\n") if line]
        except (OSError, ValueError, EOFError) as error:
            raise damaged(directory, f"its index cannot be read ({error})") from error
        expected = [INDEX_DTYPE, UNOWNED_INDEX_DTYPE]
        if not checked:
            expected.append(UNCHECKED_INDEX_DTYPE)
        if self.index.dtype not in expected or self.index.ndim != 1:
            raise damaged(
                directory,
                f"index.npy is damaged: it holds an array of shape {self.index.shape} and dtype "
                f"{self.index.dtype}, not a 1-D array of {expected[0]}",
            )
        names = self.index.dtype.names or ()
        self._crcs = self.index["crc"] if "crc" in names else None
        self.owners = self.index["owner"] if "owner" in names else None  # None: older index
        if records is not None and len(self.index) != records:
            raise damaged(
                directory,
                f"index.npy has {len(self.index)} records where manifest.json says {records}",
            )
        _check_layout(directory, self.index, self.files)
        self._positions = self.index["position"]
        self._fds: dict[int, int] = {}
        self._finalizer = weakref.finalize(self, _close_all, self._fds)
        self._sorted: bool | None = None

    def __len__(self) -> int:
        return len(self.index)

    def is_sorted(self) -> bool:
        if self._sorted is None:
            p = self._positions
            self._sorted = bool(len(p) < 2 or np.all(p[1:] >= p[:-1]))
        return self._sorted

    def lookup(self, position: int) -> tuple[int, int]:
        """The record numbers ``[start, stop)`` of ``position`` (the index must be sorted)."""
        start, stop = np.searchsorted(self._positions, (position, position + 1))
        return int(start), int(stop)

    def read(self, number: int) -> tuple[Key | None, int, Any]:
        """Record ``number`` as ``(key, draws, item)``."""
        return self.read_many(number, number + 1)[0]

    def read_many(self, start: int, stop: int) -> list[tuple[Key | None, int, Any]]:
        """Records ``[start, stop)``, reading each run in the same file at once."""
        rows = self.index[start:stop]
        files, offsets, sizes = (
            rows["file"].tolist(),
            rows["offset"].tolist(),
            rows["size"].tolist(),
        )
        positions, draws = rows["position"].tolist(), rows["draws"].tolist()
        crcs = None if self._crcs is None else self._crcs[start:stop].tolist()
        out: list[tuple[Key | None, int, Any]] = []
        keyed = self.keyed
        i, count = 0, len(files)
        while i < count:
            j = i + 1
            while (
                j < count and files[j] == files[i] and offsets[j] == offsets[j - 1] + sizes[j - 1]
            ):
                j += 1
            base = offsets[i]
            span = bytearray(offsets[j - 1] + sizes[j - 1] - base)
            self._read_into(files[i], span, base)
            view = memoryview(span)
            for k in range(i, j):
                at = offsets[k] - base
                frame = view[at : at + sizes[k]]
                if crcs is not None and zlib.crc32(frame) != crcs[k]:
                    raise damaged(
                        self.directory,
                        f"record {start + k} (in {self.files[files[i]]}) fails its checksum: "
                        "its bytes changed on disk since it was written",
                    )
                record = self._unframe(frame, start + k, files[i])
                rest, item = record if keyed else (None, record)
                position = positions[k]
                key: Key | None = None if position == _NO_POSITION else position
                if rest is not None:
                    key = (position, *rest)
                out.append((key, draws[k], item))
            i = j
        return out

    def _unframe(self, frame: memoryview, number: int, file: int) -> Any:
        try:
            record = _unframe(frame)
            if self.keyed and not (type(record) is tuple and len(record) == 2):
                raise ValueError(f"a {type(record).__name__}, not a (key rest, item) pair")
        except Exception as error:  # noqa: BLE001 - whatever garbage raises, say where
            raise damaged(
                self.directory,
                f"record {number} (in {self.files[file]}) cannot be read back "
                f"({type(error).__name__}: {error})",
            ) from error
        return record

    def _read_into(self, file: int, span: bytearray, offset: int) -> None:
        fd = self._fds.get(file)
        if fd is None:
            try:
                fd = os.open(os.path.join(self.directory, self.files[file]), os.O_RDONLY)
            except FileNotFoundError as error:
                raise damaged(self.directory, f"{self.files[file]} is missing") from error
            self._fds[file] = fd
        view = memoryview(span)
        while view:
            got = os.preadv(fd, [view], offset)
            if got <= 0:
                raise damaged(self.directory, f"{self.files[file]} is shorter than its index says")
            view, offset = view[got:], offset + got

    def close(self) -> None:
        """Close the data files (reopened on the next read)."""
        _close_all(self._fds)


def _check_layout(directory: str, index: np.ndarray, files: list[str]) -> None:
    """The index's rows must tile each data file exactly, in records of sane fields.

    That is how :class:`RecordWriter` writes them, so any other layout is a
    damaged index (or a data file replaced or cut under it): raised here,
    before a wrong offset reads part of another record, or a huge size
    allocates. Vectorised: about 0.3 s per million records (on 2 shared cores).
    """
    if not len(index):
        return
    file, offset, size, position, draws = (
        index[name].astype(np.int64) for name in ("file", "offset", "size", "position", "draws")
    )
    checks = [
        (file >= len(files), f"is in data file {{}}, but files.txt lists {len(files)}", file),
        (file < 0, "is in data file {}", file),
        (offset < 0, "starts at byte {}", offset),
        (size < _HEAD.size, "has a size of {} bytes", size),
        (position < _NO_POSITION, "has position {}", position),
        (draws < 0, "has {} draws", draws),
    ]
    for wrong, what, values in checks:
        if wrong.any():
            row = int(np.argmax(wrong))
            _index_damaged(directory, f"record {row} " + what.format(int(values[row])))
    order = np.lexsort((offset, file))
    file, offset, end = file[order], offset[order], (offset + size)[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = file[1:] != file[:-1]
    start = np.where(first, 0, np.roll(end, 1))
    if (offset != start).any():
        row = int(np.argmax(offset != start))
        _index_damaged(
            directory,
            f"record {int(order[row])} starts at byte {int(offset[row])} of "
            f"{files[file[row]]}, where the record before it there ends at byte "
            f"{int(start[row])} (records must follow each other)",
        )
    last = np.ones(len(order), dtype=bool)
    last[:-1] = first[1:]
    for number, stop in zip(file[last].tolist(), end[last].tolist(), strict=True):
        try:
            length = os.stat(os.path.join(directory, files[number])).st_size
        except FileNotFoundError as error:
            raise damaged(directory, f"{files[number]} is missing") from error
        if length != stop:
            raise damaged(
                directory,
                f"{files[number]} is {'shorter' if length < stop else 'longer'} than its index "
                f"says: {length} bytes where its records end at byte {stop} (the file was cut "
                f"or replaced since the index was written)",
            )


def _index_damaged(directory: str, what: str) -> NoReturn:
    raise damaged(directory, f"index.npy is damaged: {what}")


def _close_all(fds: dict[int, int]) -> None:
    for fd in fds.values():
        os.close(fd)
    fds.clear()
