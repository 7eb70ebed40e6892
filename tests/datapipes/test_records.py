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


# -- a damaged index: a named OSError, never an IndexError or wrong records -------------


def _written(folder, count=6) -> list:
    """Records of ``count`` positions in two data files; the items they hold."""
    folder.mkdir()
    writer = _records.RecordWriter(str(folder), "w0", max_bytes=300)
    items = [{"x": position, "pad": b"." * 90} for position in range(count)]
    for position, item in enumerate(items):
        writer.append(position, 0, item)
    writer.close()
    _records.combine(str(folder), ["w0"], sort=True)
    return items


def _rows(index, change):
    rows = np.array(index)
    change(rows)
    return rows


INDEX_DAMAGES = {
    "cut": (None, "index cannot be read"),
    "wrong dtype": (lambda i: i["offset"].astype(np.float64), r"array of shape \(6,\) and dtype"),
    "wrong shape": (lambda i: np.stack([i, i]), r"shape \(2, 6\)"),
    "file too large": (lambda i: _rows(i, lambda r: r["file"].__setitem__(2, 7)), "record 2 is in"),
    "file negative": (lambda i: _rows(i, lambda r: r["file"].__setitem__(1, -1)), "data file -1"),
    "offset negative": (lambda i: _rows(i, lambda r: r["offset"].__setitem__(1, -8)), "byte -8"),
    "offset past the end": (
        lambda i: _rows(i, lambda r: r["offset"].__setitem__(5, 1 << 40)),
        r"record 5 starts at byte 1099511627776 of w0-00002.rec, where the record before",
    ),
    "offset moved back": (
        lambda i: _rows(i, lambda r: r["offset"].__setitem__(1, 100)),
        r"record 1 starts at byte 100 of w0-00000.rec, where the record before it there ends",
    ),
    "size huge": (
        lambda i: _rows(i, lambda r: r["size"].__setitem__(5, 1 << 50)),
        r"w0-00002.rec is shorter than its index says: \d+ bytes where its records end at",
    ),
    "size zero": (lambda i: _rows(i, lambda r: r["size"].__setitem__(0, 0)), "size of 0 bytes"),
    "position": (lambda i: _rows(i, lambda r: r["position"].__setitem__(3, -7)), "position -7"),
    "draws": (lambda i: _rows(i, lambda r: r["draws"].__setitem__(3, -1)), "has -1 draws"),
}


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "unchecked"])
@pytest.mark.parametrize("damage", list(INDEX_DAMAGES))
def test_a_damaged_index_raises_a_named_os_error(tmp_path, damage, checked):
    """Each raised a bare IndexError, ValueError or MemoryError at a read, or (a negative
    file number, an offset moved back in an index without checksums) gave wrong records."""
    folder = tmp_path / "records"
    _written(folder)
    index = np.load(folder / "index.npy")
    if not checked:
        stripped = np.zeros(len(index), dtype=_records.UNCHECKED_INDEX_DTYPE)
        for name in stripped.dtype.names:
            stripped[name] = index[name]
        index = stripped
    change, message = INDEX_DAMAGES[damage]
    if damage == "cut":
        np.save(folder / "index.npy", index)
        data = (folder / "index.npy").read_bytes()
        (folder / "index.npy").write_bytes(data[: len(data) - 20])
    else:
        np.save(folder / "index.npy", change(index))
    with pytest.raises(OSError, match=message) as raised:
        reader = _records.RecordReader(str(folder))
        [reader.read(n) for n in range(len(reader))]
    assert f"the snapshot is damaged: delete {folder} to rebuild it" in str(raised.value)
    assert "index" in str(raised.value)


def test_a_data_file_replaced_under_its_index_raises_before_any_read(tmp_path):
    folder = tmp_path / "records"
    items = _written(folder)
    assert [_records.RecordReader(str(folder)).read(n)[2] for n in range(6)] == items
    (folder / "w0-00000.rec").write_bytes((folder / "w0-00000.rec").read_bytes() + b"\0" * 64)
    with pytest.raises(OSError, match=r"w0-00000.rec is longer than its index says: \d+ bytes"):
        _records.RecordReader(str(folder))


def test_a_sealed_index_with_a_changed_byte_raises_naming_it(tmp_path):
    """A changed position or draw count passes every layout check and each record's CRC
    (which covers the record, not its row): with the manifest's CRC-32 of the index it
    raises; without it (formats 1 to 3) it gave a record under another position."""
    folder = tmp_path / "records"
    _written(folder)
    sealed = _records.checksums(str(folder))
    index = np.load(folder / "index.npy")
    index["position"][[2, 3]] = index["position"][[3, 2]]
    index.sort(order="position", kind="stable")
    np.save(folder / "index.npy", index)
    assert _records.RecordReader(str(folder)).read(2)[0] == 2  # the record of position 3
    with pytest.raises(OSError, match=r"index.npy is damaged: its CRC-32 is 0x[0-9a-f]{8} whe"):
        _records.RecordReader(str(folder), sealed=sealed)
    (folder / "files.txt").write_text("w0-00001.rec\nw0-00000.rec")  # two names swapped
    sealed["index.npy"] = _records.checksums(str(folder))["index.npy"]
    with pytest.raises(OSError, match=r"files.txt is damaged: its CRC-32"):
        _records.RecordReader(str(folder), sealed=sealed)
