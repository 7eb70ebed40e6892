"""ZipArchiveLoader (load_from_zip): member files of zip archives."""

from __future__ import annotations

import io
import os
import zipfile

import pytest

from pipeloom.datapipes import FileLister, IterableWrapper, ZipArchiveLoader
from pipeloom.testing import check_resume_from_every_step, collect
from tests.datapipes.everywhere import check_same_output_everywhere


def zip_bytes(members):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members:
            if name.endswith("/"):
                archive.mkdir(name.rstrip("/"))
            else:
                archive.writestr(name, data)
    return buffer.getvalue()


@pytest.fixture
def archives(tmp_path):
    for index in range(3):
        members = [("dir/", b""), *((f"dir/{j}.txt", f"{index}-{j}".encode()) for j in range(3))]
        (tmp_path / f"a{index}.zip").write_bytes(zip_bytes(members))
    return tmp_path


def read(items):
    return [
        (
            os.path.basename(os.path.dirname(os.path.dirname(p))) + "/" + os.path.basename(p),
            s.read(),
        )
        for p, s in items
    ]


def test_yields_each_file_member_as_a_stream_skipping_directories(archives):
    items = collect(FileLister(archives, "*.zip").open_files("rb").load_from_zip())
    assert [p for p, _ in items][:3] == [
        os.path.join(archives, "a0.zip", "dir", f"{j}.txt") for j in range(3)
    ]
    assert [s.read() for _, s in items] == [f"{i}-{j}".encode() for i in range(3) for j in range(3)]
    assert all(isinstance(s, io.BytesIO) for _, s in items)


def test_reads_streams_that_cannot_seek_and_bytes_items():
    class Unseekable(io.RawIOBase):
        def __init__(self, data):
            self._data = io.BytesIO(data)

        def readable(self):
            return True

        def readinto(self, buffer):
            return self._data.readinto(buffer)

    data = zip_bytes([("x.txt", b"X")])
    stream = io.BufferedReader(Unseekable(data))
    assert not stream.seekable()
    got = list(IterableWrapper([("u.zip", stream), ("b.zip", data)]).load_from_zip())
    assert [(p, s.read()) for p, s in got] == [("u.zip/x.txt", b"X"), ("b.zip/x.txt", b"X")]
    assert stream.closed


def test_members_feed_the_text_readers(archives):
    lines = FileLister(archives, "a1.zip").open_files("rb").load_from_zip().readlines(decode=True)
    assert [line for _, line in lines] == ["1-0", "1-1", "1-2"]


def test_errors_name_the_archive():
    with pytest.raises(zipfile.BadZipFile, match="'bad.zip' is not a readable zip archive"):
        list(IterableWrapper([("bad.zip", io.BytesIO(b"not a zip"))]).load_from_zip())
    with pytest.raises(TypeError, match=r"opened in text mode; use open_files\(mode='rb'\)"):
        list(IterableWrapper([("t.zip", io.StringIO("x"))]).load_from_zip())
    with pytest.raises(ValueError, match="length must be an int >= 0, or -1"):
        IterableWrapper([]).load_from_zip(length=-5)
    with pytest.raises(TypeError, match=r"pass load_from_zip\(length=N\)"):
        len(IterableWrapper([]).load_from_zip())


def test_length_and_repr():
    dp = IterableWrapper([]).load_from_zip(length=4)
    assert isinstance(dp, ZipArchiveLoader)
    assert len(dp) == 4 and repr(dp) == "ZipArchiveLoader(length=4)"


def test_resume_from_every_step(archives):
    check_resume_from_every_step(
        lambda: (
            FileLister(archives, "*.zip")
            .open_files("rb")
            .load_from_zip()
            .map(lambda item: (item[0], item[1].read()))
        )
    )


def test_same_output_everywhere(archives):
    epochs = check_same_output_everywhere(
        lambda: (
            FileLister(archives, "*.zip")
            .shuffle()
            .sharding_filter()
            .open_files("rb")
            .load_from_zip()
            .map(lambda item: (os.path.basename(item[0]), item[1].read()))
        )
    )
    assert sorted(data for _, data in epochs[0]) == sorted(
        f"{i}-{j}".encode() for i in range(3) for j in range(3)
    )
