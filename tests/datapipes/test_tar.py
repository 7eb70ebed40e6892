"""TarArchiveLoader: streamed tar shards, strict about truncation, resumable mid-shard."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import random
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import IterableWrapper, IterDataPipe, NotAvailable, reset_pipeline
from pipeloom.datapipes._files import FileLister, FileOpener
from pipeloom.datapipes._tar import TarArchiveLoader, TarMemberPath
from pipeloom.testing import check_resume_from_every_step, collect, collect_async


def tar_bytes(members, *, directory=False):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        if directory:
            info = tarfile.TarInfo("folder")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def shard_members(shard):
    return [(f"s{shard}/{i:03d}.bin", bytes([shard, i]) * (i * 200)) for i in range(4)]


@pytest.fixture
def shards(tmp_path):
    for shard in range(3):
        (tmp_path / f"shard-{shard}.tar").write_bytes(tar_bytes(shard_members(shard)))
    return tmp_path


def expected_members(root, shards=range(3)):
    return [
        (f"{root}/shard-{s}.tar/{name}", data) for s in shards for name, data in shard_members(s)
    ]


class Unseekable(io.RawIOBase):
    """A forward-only stream, like an HTTP response."""

    def __init__(self, data):
        self._inner = io.BytesIO(data)

    def readable(self):
        return True

    def readinto(self, buffer):
        return self._inner.readinto(buffer)


class Flaky(IterDataPipe):
    def __init__(self, make_items, seed=0):
        self.make_items, self.seed = make_items, seed
        self._items, self._rng = None, random.Random(seed)

    def reset(self):
        self._items, self._rng = None, random.Random(self.seed)

    def async_next(self):
        if self._items is None:
            self._items = iter(self.make_items())
        if self._rng.random() < 0.5:
            raise NotAvailable
        return next(self._items)


def test_yields_shard_slash_member_and_bytes_for_each_regular_file(shards):
    pipe = FileLister(shards, "*.tar").open_files("rb").load_from_tar()
    assert collect(pipe) == expected_members(shards)
    assert collect_async(pipe) == expected_members(shards)


def test_member_paths_know_their_shard_and_survive_pickling(shards):
    path = collect(FileLister(shards, "*.tar").open_files("rb").load_from_tar())[0][0]
    assert isinstance(path, TarMemberPath) and path.shard == f"{shards}/shard-0.tar"
    assert path.member == "s0/000.bin"
    copied = pickle.loads(pickle.dumps(path))
    assert copied == path and copied.shard == path.shard


def test_directories_are_skipped():
    data = tar_bytes([("folder/x.txt", b"x")], directory=True)
    assert list(TarArchiveLoader(IterableWrapper([("t.tar", io.BytesIO(data))]))) == [
        ("t.tar/folder/x.txt", b"x")
    ]


def test_reads_from_a_stream_that_cannot_seek():
    data = tar_bytes([("a", b"1" * 3000), ("b", b"2")])
    items = list(TarArchiveLoader(IterableWrapper([("u.tar", Unseekable(data))])))
    assert items == [("u.tar/a", b"1" * 3000), ("u.tar/b", b"2")]


def test_compressed_shards_stream_with_r_pipe_star():
    data = gzip.compress(tar_bytes([("a", b"1")]))
    assert list(TarArchiveLoader(IterableWrapper([("g.tgz", io.BytesIO(data))]), mode="r|*")) == [
        ("g.tgz/a", b"1")
    ]


def test_each_shard_stream_is_closed_when_read(shards):
    opener = FileLister(shards, "*.tar").open_files("rb")
    loader = TarArchiveLoader(opener)
    reset_pipeline(loader)
    for _ in range(5):  # into the second shard
        loader.async_next()
    assert all(stream.closed for _, _, stream in opener._handed[:-1])
    reset_pipeline(loader)
    assert all(stream.closed for _, _, stream in opener._handed)


@pytest.mark.parametrize("cut", [700, 512 * 3 + 100, -1024])
def test_truncated_shard_raises_naming_the_shard_and_offset(cut):
    data = tar_bytes([("a", b"x" * 600), ("b", b"y" * 600), ("c", b"z")])
    truncated = data[:cut] if cut > 0 else data[: len(data) + cut - 8192]
    loader = TarArchiveLoader(IterableWrapper([("bad.tar", io.BytesIO(truncated))]))
    with pytest.raises(tarfile.ReadError, match=r"tar shard 'bad.tar' is corrupted or truncated.*byte offset \d+"):
        list(loader)


def test_missing_end_marker_is_truncation_not_a_silent_end():
    data = tar_bytes([("a", b"x"), ("b", b"y")])
    cut = data[: 512 * 2]  # header + data of "a", then nothing
    with pytest.raises(tarfile.ReadError, match=r"after 1 member\(s\)"):
        list(TarArchiveLoader(IterableWrapper([("cut.tar", io.BytesIO(cut))])))


def test_corrupted_header_raises():
    data = bytearray(tar_bytes([("a", b"x"), ("b", b"y")]))
    data[1024:1024 + 100] = b"\xff" * 100  # scramble the second header
    with pytest.raises(tarfile.ReadError, match="invalid member header"):
        list(TarArchiveLoader(IterableWrapper([("bad.tar", io.BytesIO(bytes(data)))])))


def test_non_tar_file_raises_naming_it(tmp_path):
    (tmp_path / "notes.tar").write_text("this is not a tar file\n" * 100)
    with pytest.raises(tarfile.ReadError, match=r"notes.tar' is not a readable tar archive"):
        list(FileLister(tmp_path).open_files("rb").load_from_tar())


def test_on_error_skip_drops_the_rest_of_the_bad_shard_and_goes_on(shards):
    good = (shards / "shard-1.tar").read_bytes()
    (shards / "shard-1.tar").write_bytes(good[:1500])
    pipe = FileLister(shards, "*.tar").open_files("rb").load_from_tar(on_error="skip")
    got = collect(pipe)
    assert got[:4] == expected_members(shards)[:4] and got[-4:] == expected_members(shards)[-4:]
    assert len(got) == 10  # shard 1 kept the two members before the cut
    with pytest.warns(UserWarning, match=r"shard-1.tar' is corrupted .* skipping the rest"):
        assert len(collect(FileLister(shards, "*.tar").open_files("rb").load_from_tar(on_error="warn"))) == 10


def test_error_closes_the_shard_stream(tmp_path):
    (tmp_path / "x.tar").write_bytes(b"garbage" * 200)
    opener = FileLister(tmp_path).open_files("rb")
    with pytest.raises(tarfile.ReadError):
        list(opener.load_from_tar())
    assert all(stream.closed for _, _, stream in opener._handed)


def test_resumes_from_every_step_inside_shards(shards):
    check_resume_from_every_step(lambda: FileLister(shards, "*.tar").open_files("rb").load_from_tar())


def test_survives_not_available_from_upstream(shards):
    def items():
        return [(p, open(p, "rb")) for p in FileLister(shards, "*.tar")]

    loader = TarArchiveLoader(Flaky(items))
    reset_pipeline(loader)
    got = []
    while True:
        try:
            got.append(loader.async_next())
        except NotAvailable:
            continue
        except StopIteration:
            break
    assert got == expected_members(shards)


def test_bad_arguments_are_rejected():
    source = IterableWrapper([])
    with pytest.raises(ValueError, match=r"mode must be a tarfile read mode.*got 'w'.*'r\|\*'"):
        TarArchiveLoader(source, mode="w")
    with pytest.raises(ValueError, match=r"on_error must be one of .* got 'ignore'"):
        TarArchiveLoader(source, on_error="ignore")
    with pytest.raises(TypeError, match=r"expects \(path, stream\) items, got str"):
        list(TarArchiveLoader(IterableWrapper(["x.tar"])))
    assert repr(TarArchiveLoader(source)) == "TarArchiveLoader(mode='r|', on_error='raise')"


@settings(max_examples=25, deadline=None)
@given(st.lists(st.binary(max_size=1500), max_size=6))
def test_round_trips_any_member_contents(contents):
    members = [(f"m{i}.bin", data) for i, data in enumerate(contents)]
    loader = TarArchiveLoader(IterableWrapper([("h.tar", io.BytesIO(tar_bytes(members)))]))
    assert list(loader) == [(f"h.tar/{name}", data) for name, data in members]


def test_leaves_no_descriptor_open(shards):
    before = len(os.listdir("/proc/self/fd"))
    pipe = FileLister(shards, "*.tar").open_files("rb").load_from_tar()
    collect(pipe)
    it = iter(pipe)
    next(it)
    reset_pipeline(pipe)
    assert len(os.listdir("/proc/self/fd")) == before
