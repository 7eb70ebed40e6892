"""Attacks on snapshot format 2: a snapshot written after a tar fan-out and read back under
every reading service; damaged manifests, indexes and records raise a named error."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import pipeloom
from pipeloom.datapipes import FileLister, IterableWrapper
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from tests.datapipes.test_tar import tar_bytes

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def shards(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    for shard in range(4):  # shards of 0 to 3 members: positions with several outputs, or none
        members = [(f"s{shard}/{i}.bin", bytes([shard, i]) * (50 + i)) for i in range(shard)]
        (folder / f"shard-{shard}.tar").write_bytes(tar_bytes(members))
    return str(folder)


def read_member(pair):
    path, data = pair  # the member's bytes (a stream if opened lazily)
    if hasattr(data, "read"):
        with data:
            data = data.read()
    return str(path).rsplit("/", 2)[-2:], data


def jitter(sample):
    name, data = sample
    return name, len(data), data[:4], float(pipeloom.item_rng().random())


def identity(x):
    return x


def _tar_pipe(shards: str, snapshot: str | None):
    made = FileLister(shards, "*.tar").open_files("rb").load_from_tar().map(read_member)
    made = made.snapshot(snapshot) if snapshot is not None else made.map(identity)
    return made.map(jitter)  # draws item_rng(): each replayed sample must draw its own


def _epochs(pipe, service, count=2):
    with pipeloom.DataLoader(pipe, service, seed=5) as loader:
        return [list(loader) for _ in range(count)]


SERVICES = {
    "in-process": lambda: None,
    "threads": lambda: ThreadReadingService(2),
    "fork": lambda: MultiProcessingReadingService(2, start_method="fork", timeout=60),
    "spawn": lambda: MultiProcessingReadingService(2, start_method="spawn", timeout=60),
}


@pytest.mark.parametrize("writer", ["in-process", "fork"])
@pytest.mark.parametrize("reader", list(SERVICES))
def test_a_snapshot_after_a_tar_fan_out_reads_back_under_every_service(
    shards, tmp_path, writer, reader
):
    reference = _epochs(_tar_pipe(shards, None), None)
    assert len(reference[0]) == 0 + 1 + 2 + 3
    snapshot = str(tmp_path / "snap")
    assert _epochs(_tar_pipe(shards, snapshot), SERVICES[writer]()) == reference  # writes
    assert _tar_pipe(shards, snapshot).source.is_complete()
    assert _epochs(_tar_pipe(shards, snapshot), SERVICES[reader]()) == reference  # reads


# -- damage: a clear error, never wrong items --------------------------------------
def square(x):
    return {"x": x * x, "name": f"item-{x:04d}"}


def _pipe(path):
    return IterableWrapper(range(40)).sharding_filter().map(square).snapshot(path)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A committed snapshot (its directory) and the items it holds."""
    root = str(tmp_path_factory.mktemp("written"))
    expected = list(pipeloom.DataLoader(_pipe(root), seed=0))
    (name,) = [n for n in os.listdir(root) if not n.startswith(".")]
    return os.path.join(root, name), expected


def _copy(written, tmp_path) -> tuple[str, str]:
    """A copy of the snapshot to damage: (root, its directory)."""
    directory, _ = written
    root = str(tmp_path / "copy")
    shutil.copytree(directory, os.path.join(root, os.path.basename(directory)))
    return root, os.path.join(root, os.path.basename(directory))


def _record_file(directory: str) -> str:
    return os.path.join(
        directory, sorted(f for f in os.listdir(directory) if f.endswith(".rec"))[0]
    )


def _truncate(path: str, keep) -> None:
    with open(path, "rb") as file:
        data = file.read()
    with open(path, "wb") as file:
        file.write(data[: keep(len(data))])


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as file:
        file.write(data)


def _flip(path: str, at: int) -> None:
    with open(path, "rb") as file:
        data = bytearray(file.read())
    data[at] ^= 0x01
    _write(path, bytes(data))


DAMAGES = {
    "manifest empty": (lambda d: _write(f"{d}/manifest.json", b""), "manifest.json cannot be"),
    "manifest cut": (lambda d: _truncate(f"{d}/manifest.json", lambda n: n // 2), "manifest"),
    # was silent: no "format" read format-2 records as format 1, items as (None, item)
    "manifest {}": (lambda d: _write(f"{d}/manifest.json", b"{}"), "lacks format, records"),
    "manifest newer": (
        lambda d: _write(f"{d}/manifest.json", b'{"format": 9, "records": 40, "stamper": true}'),
        "format 9; this pipeloom reads formats 1 to 5",
    ),
    "manifest unsealed": (
        lambda d: _write(f"{d}/manifest.json", b'{"format": 4, "records": 40, "stamper": true}'),
        r"format 4 but no CRC-32 of index.npy and files.txt \('checksums': None\)",
    ),
    "manifest count": (
        lambda d: _write(f"{d}/manifest.json", b'{"format": 2, "records": 41, "stamper": true}'),
        "40 records where manifest.json says 41",
    ),
    "index cut": (lambda d: _truncate(f"{d}/index.npy", lambda n: n - 32), "index.npy is damaged"),
    "index empty": (lambda d: _write(f"{d}/index.npy", b""), "index.npy is damaged"),
    "index gone": (lambda d: os.unlink(f"{d}/index.npy"), "index cannot be read"),
    # was silent: a changed position gave a record under another position (each record's
    # CRC-32 covers the record, not its row in the index)
    "index position changed": (lambda d: _flip(f"{d}/index.npy", -36), "index.npy is damaged"),
    "files.txt empty": (lambda d: _write(f"{d}/files.txt", b""), "files.txt is damaged"),
    "record file gone": (lambda d: os.unlink(_record_file(d)), "w0000-00000.rec is missing"),
    "record file cut": (lambda d: _truncate(_record_file(d), lambda n: n // 2), "is shorter"),
    "record file zeroed": (
        lambda d: _write(_record_file(d), bytes(os.path.getsize(_record_file(d)))),
        r"record 0 \(in w0000-00000.rec\) fails its checksum",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_snapshot_raises_a_named_error(written, tmp_path, damage):
    root, directory = _copy(written, tmp_path)
    hurt, message = DAMAGES[damage]
    hurt(directory)
    with pytest.raises(OSError, match=message) as raised:
        list(pipeloom.DataLoader(_pipe(root), seed=0))
    assert f"the snapshot is damaged: delete {directory} to rebuild it" in str(raised.value)


def test_a_damaged_snapshot_raises_in_worker_processes_too(written, tmp_path):
    root, directory = _copy(written, tmp_path)
    _write(_record_file(directory), bytes(os.path.getsize(_record_file(directory))))
    service = MultiProcessingReadingService(2, start_method="fork", timeout=60)
    with pytest.raises(OSError, match="the snapshot is damaged"):
        list(pipeloom.DataLoader(_pipe(root), service, seed=0))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(at=st.floats(0, 1), bit=st.integers(0, 7))
@example(at=0.5, bit=0)  # inside a record in the middle
def test_a_changed_byte_in_a_record_file_never_gives_wrong_items(written, tmp_path, at, bit):
    """Each record's CRC-32 is checked before it is unpickled: a changed byte inside an
    item's payload (a string's characters, a tensor's buffer) raises, naming the record."""
    _, expected = written
    root, directory = _copy(written, tmp_path / os.urandom(6).hex())
    path = _record_file(directory)
    with open(path, "rb") as file:
        data = bytearray(file.read())
    data[min(int(at * len(data)), len(data) - 1)] ^= 1 << bit
    _write(path, bytes(data))
    try:
        got = list(pipeloom.DataLoader(_pipe(root), seed=0))
    except OSError as error:
        assert "the snapshot is damaged" in str(error)
    else:
        assert got == expected
