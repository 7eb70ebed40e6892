"""A custom storage format as pipeloom blocks: the template to copy.

The format ("PLR", pipeloom records): a data file is a sequence of records,
each an 8-byte little-endian length followed by that many payload bytes; a
sibling index file ``<name>.idx`` holds the byte offset of every record as
little-endian uint64 values, for random access.

Two readers show the two block styles:

* :class:`RecordReader` (``IterDataPipe``, functional name ``read_records``):
  streams the records of each file path it receives. It is *shardable* (a
  reading service gives each worker every n-th file), stamps each record's
  position, and saves ``(files started, records emitted)`` as its state.
* :class:`RecordDataset` (``MapDataPipe``): random access to one file via its
  index with ``async_get(i)``. ``lazy_init`` opens the file in the worker that
  uses the block (file handles are never pickled), and ``__len__`` comes from
  the index.

Run it: ``python examples/custom_record_format.py``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterable
from typing import Any, BinaryIO

import numpy as np

from pipeloom.datapipes import IterableWrapper, IterDataPipe, MapDataPipe, functional_datapipe
from pipeloom.datapipes.runtime import forget_lazy_init

_HEADER = 8  # bytes: the record's length, little-endian (plain ints pickle, for spawn)


def write_records(path: str, records: Iterable[bytes]) -> int:
    """Write ``records`` to ``path`` and its index to ``path + '.idx'``; return the count."""
    offsets = []
    with open(path, "wb") as data:
        for record in records:
            offsets.append(data.tell())
            data.write(len(record).to_bytes(_HEADER, "little"))
            data.write(record)
    np.asarray(offsets, dtype="<u8").tofile(path + ".idx")
    return len(offsets)


def _read_record(file: BinaryIO, path: str) -> bytes | None:
    header = file.read(_HEADER)
    if not header:
        return None  # clean end of file
    if len(header) < _HEADER:
        raise ValueError(f"{path}: truncated record header at byte {file.tell() - len(header)}")
    size = int.from_bytes(header, "little")
    payload = file.read(size)
    if len(payload) != size:
        start = file.tell() - len(payload) - _HEADER
        raise ValueError(f"{path}: record at byte {start} is truncated")
    return payload


@functional_datapipe("read_records")
class RecordReader(IterDataPipe):
    """Stream ``(path, record_bytes)`` from each PLR file path of ``source``.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "a.plr")
        >>> write_records(path, [b"x", b"yz"])
        2
        >>> list(IterableWrapper([path]).read_records(return_path=False))
        [b'x', b'yz']
    """

    inputs = ("source",)  # the attribute holding the upstream block
    # It stamps each record with its file's position and its index in the file
    # (stamp_position below), so every reading service merges records in the
    # in-process order and item_rng() draws the same for each record.
    stamps_positions = True

    def __init__(self, source: IterDataPipe, *, return_path: bool = True) -> None:
        if not isinstance(source, IterDataPipe):  # validate at construction
            raise TypeError(
                f"RecordReader expects an IterDataPipe of paths, got {type(source).__name__}"
            )
        if not isinstance(return_path, bool):
            raise TypeError(f"return_path must be True or False, got {return_path!r}")
        self.source = source
        self.return_path = return_path
        self._total, self._index = 1, 0  # sharding: keep files p % total == index
        self.reset()

    # -- sharding: a reading service calls these on each worker's copy ----------
    def is_shardable(self) -> bool:
        return True

    def sharding_settings(self, total: int, index: int) -> None:
        if not (isinstance(total, int) and isinstance(index, int) and 0 <= index < total):
            raise ValueError(f"expected 0 <= index < total, got total={total!r} index={index!r}")
        self._total, self._index = total, index

    # -- iteration: explicit state, so state_dict is exact ---------------------
    def reset(self) -> None:
        self._close()
        self._files = 0  # paths pulled from source this epoch
        self._records = 0  # records emitted from the current file
        self._path: str | None = None
        self._offset = 0  # byte offset of the next record in the current file
        self._emitted = 0  # records emitted this epoch
        self._resume_from = 0  # files before it were read before a resume

    def resume_at(self, position: int) -> None:
        """Skip the files before ``position`` (a reading service resuming mid-epoch)."""
        self._resume_from = position

    def async_next(self) -> Any:
        while True:
            if self._path is None:
                path = self.source.async_next()  # may raise NotAvailable / StopIteration
                self._files += 1
                position = self._files - 1  # the file's position in the stream of paths
                if position % self._total != self._index or position < self._resume_from:
                    continue  # another worker's file, or one read before a resume
                self._path, self._offset, self._records = str(path), 0, 0
            if self._file is None:
                self._file = open(self._path, "rb")  # noqa: SIM115 (closed in _close)
                self._file.seek(self._offset)
            record = _read_record(self._file, self._path)
            if record is None:
                self._close()
                self._path = None
                continue
            self._offset = self._file.tell()
            self._records += 1
            # record j of the file at position p: its key is (p, j)
            self.stamp_position(self._files - 1, output=self._records - 1)
            self._emitted += 1
            return (self._path, record) if self.return_path else record

    def _close(self) -> None:
        file, self._file = getattr(self, "_file", None), None
        if file is not None:
            file.close()

    def state_dict(self) -> dict[str, Any]:
        return {
            "files": self._files,
            "path": self._path,
            "offset": self._offset,
            "records": self._records,
            "emitted": self._emitted,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._close()  # the file is re-opened and seeked on the next call
        self._files, self._path = state["files"], state["path"]
        self._offset, self._records, self._emitted = (
            state["offset"],
            state["records"],
            state["emitted"],
        )

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_file"] = None  # file handles never travel to workers
        return state

    def __del__(self) -> None:
        self._close()

    def __repr__(self) -> str:
        return f"RecordReader(return_path={self.return_path})"


class RecordDataset(MapDataPipe):
    """Random access to the records of one PLR file through its index.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "b.plr")
        >>> _ = write_records(path, [b"a", b"bb", b"ccc"])
        >>> dataset = RecordDataset(path)
        >>> len(dataset), dataset[2], dataset.async_get(0)
        (3, b'ccc', b'a')
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        if not os.path.exists(self.path + ".idx"):
            raise FileNotFoundError(
                f"RecordDataset needs the index {self.path + '.idx'!r}; write files with "
                f"write_records(), which creates it"
            )
        self._file: BinaryIO | None = None
        self._offsets: np.ndarray | None = None

    def lazy_init(self) -> None:
        """Runs once where the block runs (e.g. in a worker), before first use."""
        self._offsets = np.fromfile(self.path + ".idx", dtype="<u8")  # compact: no copy-on-access
        self._file = open(self.path, "rb")  # noqa: SIM115

    def async_get(self, index: int) -> bytes:
        # A local read is fast, so this never raises NotAvailable; a remote
        # store would start a request here, raise NotAvailable, and answer later.
        assert self._offsets is not None and self._file is not None  # set by lazy_init
        if not -len(self._offsets) <= index < len(self._offsets):
            raise IndexError(
                f"record {index} out of range for {len(self._offsets)} records in {self.path}"
            )
        self._file.seek(int(self._offsets[index]))
        record = _read_record(self._file, self.path)
        return record if record is not None else b""

    def __len__(self) -> int:
        assert self._offsets is not None
        return len(self._offsets)

    def state_dict(self) -> dict[str, Any]:
        return {}  # random access keeps no iteration state

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_file"] = state["_offsets"] = None  # lazy_init runs again in the copy
        return state

    def close(self) -> None:
        """Close the data file (``lazy_init`` re-opens it on the next use)."""
        file, self._file = getattr(self, "_file", None), None
        forget_lazy_init(self)
        if file is not None:
            file.close()

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RecordDataset(path={self.path!r})"


def main(root: str | None = None) -> dict[str, Any]:
    """Write a small data set, read it both ways, shard it, resume it; return a summary."""
    from pipeloom.testing import check_resume_from_every_step

    root = root or tempfile.mkdtemp(prefix="plr-")
    paths = []
    for shard in range(3):
        path = os.path.join(root, f"part-{shard}.plr")
        write_records(path, (f"shard {shard} record {i}".encode() for i in range(4)))
        paths.append(path)

    stream = IterableWrapper(paths).read_records(return_path=False)
    streamed = list(stream)
    per_worker = []
    for index in range(2):  # what a 2-worker reading service does
        worker = IterableWrapper(paths).read_records(return_path=False)
        worker.sharding_settings(2, index)
        per_worker.append(list(worker))
    check_resume_from_every_step(lambda: IterableWrapper(paths).read_records())

    dataset = RecordDataset(paths[1])
    random_access = [dataset[i] for i in (3, 0, 2)]
    dataset.close()
    summary = {
        "records": len(streamed),
        "first": streamed[0],
        "per_worker": [len(w) for w in per_worker],
        "random_access": random_access,
        "length": len(dataset),
    }
    print(
        f"streamed {summary['records']} records from {len(paths)} files; first {summary['first']!r}"
    )
    print(f"2 sharded workers read {summary['per_worker']} records")
    print(f"random access to {paths[1]}: {random_access}")
    return summary


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
