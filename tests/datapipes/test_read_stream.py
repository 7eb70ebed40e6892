"""StreamChunkReader (read_from_stream): stream contents whole or in chunks."""

from __future__ import annotations

import io

import pytest

from pipeloom.datapipes import FileLister, IterableWrapper, StreamChunkReader
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere


@pytest.fixture
def files(tmp_path):
    for index in range(4):
        (tmp_path / f"{index}.bin").write_bytes(bytes(range(index * 3, index * 3 + 2 + index)))
    return tmp_path


def test_reads_in_chunks_or_whole_and_closes():
    streams = [io.StringIO("abcde"), io.BytesIO(b"xyz")]
    items = IterableWrapper([("s", streams[0]), ("b", streams[1])])
    assert list(items.read_from_stream(chunk=2)) == [
        ("s", "ab"),
        ("s", "cd"),
        ("s", "e"),
        ("b", b"xy"),
        ("b", b"z"),
    ]
    assert all(s.closed for s in streams)
    whole = IterableWrapper([("s", io.StringIO("abc")), ("e", io.BytesIO(b""))])
    assert list(whole.read_from_stream()) == [("s", "abc")]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_chunk_is_rejected(bad):
    with pytest.raises(ValueError, match=f"chunk must be an int >= 1.*got {bad!r}"):
        IterableWrapper([]).read_from_stream(chunk=bad)


def test_repr():
    assert repr(StreamChunkReader(IterableWrapper([]), 4)) == "StreamChunkReader(chunk=4)"


@pytest.mark.parametrize("chunk", [None, 1, 2])
def test_resume_from_every_step(files, chunk):
    check_resume_from_every_step(
        lambda: FileLister(files).open_files("rb").read_from_stream(chunk=chunk)
    )


def test_same_output_everywhere(files):
    epochs = check_same_output_everywhere(
        lambda: FileLister(files).sharding_filter().open_files("rb").read_from_stream(chunk=2)
    )
    assert b"".join(data for _, data in epochs[0]) == b"".join(
        bytes(range(i * 3, i * 3 + 2 + i)) for i in range(4)
    )
