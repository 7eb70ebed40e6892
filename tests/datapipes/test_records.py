"""Record files: a record keeps its item's whole key; records of the first format still read."""

from __future__ import annotations

import numpy as np
import pytest

from pipeloom.datapipes import _records


def test_a_snapshot_of_the_first_format_still_reads_its_records(tmp_path, monkeypatch):
    """Records written before they kept their key's rest (format 1) hold the bare item."""

    def write(folder, frame):
        monkeypatch.setattr(_records, "_frame", frame)
        folder.mkdir()
        writer = _records.RecordWriter(str(folder), "w0", max_bytes=1 << 20)
        writer.append((4, 1), 0, "item")
        writer.close()
        _records.combine(str(folder), ["w0"], sort=True)

    keyed_frame = _records._frame
    write(tmp_path / "new", keyed_frame)
    assert _records.RecordReader(str(tmp_path / "new")).read(0) == ((4, 1), 0, "item")
    write(tmp_path / "old", lambda record: keyed_frame(record[1]))  # format 1: the bare item
    old = _records.RecordReader(str(tmp_path / "old"), keyed=False)
    assert old.read(0) == (4, 0, "item")


def test_a_snapshot_written_in_the_first_format_replays_its_items(tmp_path, monkeypatch):
    """The manifest's format says how to read its records: bare items under format 1."""
    from pipeloom import DataLoader
    from pipeloom.datapipes import IterableWrapper

    def pipe():
        return IterableWrapper(range(6)).sharding_filter().flatmap(lambda x: [x, -x])

    keyed_frame = _records._frame
    monkeypatch.setattr(_records, "_frame", lambda record: keyed_frame(record[1]))
    monkeypatch.setattr("pipeloom.datapipes._snapshot_store.FORMAT", 1)
    written = list(DataLoader(pipe().snapshot(tmp_path), seed=0))
    monkeypatch.undo()
    assert pipe().snapshot(tmp_path).is_complete()
    assert list(DataLoader(pipe().snapshot(tmp_path), seed=0)) == written == list(pipe())


def test_an_index_without_checksums_is_read_unchecked_unless_its_format_has_them(tmp_path):
    """Indexes written before records had a CRC-32 still read; one that must have them
    (a format-3 snapshot's) and lacks them is damaged, not silently unchecked."""
    writer = _records.RecordWriter(str(tmp_path), "w0", max_bytes=1 << 20)
    for position in range(3):
        writer.append(position, 0, {"x": position})
    writer.close()
    _records.combine(str(tmp_path), ["w0"], sort=True)
    index = np.load(tmp_path / "index.npy")
    assert index.dtype == _records.INDEX_DTYPE and index["crc"].all()
    stripped = np.zeros(len(index), dtype=_records.UNCHECKED_INDEX_DTYPE)
    for name in stripped.dtype.names:
        stripped[name] = index[name]
    np.save(tmp_path / "index.npy", stripped)
    reader = _records.RecordReader(str(tmp_path))
    assert [reader.read(n)[2] for n in range(3)] == [{"x": 0}, {"x": 1}, {"x": 2}]
    with pytest.raises(OSError, match="the snapshot is damaged"):
        _records.RecordReader(str(tmp_path), checked=True)
