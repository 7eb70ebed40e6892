"""Decompressor (decompress/extract), Bz2FileLoader and XzFileLoader."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import tarfile
import zipfile

import pytest

from pipeloom.datapipes import FileLister, IterableWrapper
from pipeloom.datapipes._decompress import (
    Bz2FileLoader,
    CompressionType,
    Decompressor,
    XzFileLoader,
)
from pipeloom.testing import check_resume_from_every_step, collect
from tests.datapipes.everywhere import check_same_output_everywhere

COMPRESS = {".gz": gzip.compress, ".xz": lzma.compress, ".bz2": bz2.compress}


@pytest.fixture
def files(tmp_path):
    for index, suffix in enumerate([".gz", ".xz", ".bz2"] * 2):
        text = "".join(f"{index}:{line}\n" for line in range(4)).encode()
        (tmp_path / f"f{index}.txt{suffix}").write_bytes(COMPRESS[suffix](text))
    return tmp_path


def tar_bytes():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("m.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"m"))
    return buffer.getvalue()


def test_detects_the_format_from_the_suffix_and_keeps_the_path(files):
    opener = FileLister(files).open_files("rb")
    got = collect(opener.decompress())
    assert [p for p, _ in got] == sorted(str(p) for p in files.iterdir())
    texts = [stream.read().decode() for _, stream in got]
    assert texts == ["".join(f"{i}:{line}\n" for line in range(4)) for i in range(6)]


def test_archives_come_out_as_tarfile_and_zipfile_objects():
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("z.txt", "z")
    items = IterableWrapper([("a.tar.gz", io.BytesIO(tar_bytes())), ("b.zip", zipped)])
    (_, tar), (_, zip_) = list(items.extract())
    assert isinstance(tar, tarfile.TarFile) and tar.getnames() == ["m.txt"]
    assert isinstance(zip_, zipfile.ZipFile) and zip_.namelist() == ["z.txt"]


def test_file_type_overrides_the_suffix_and_accepts_aliases():
    data = gzip.compress(b"x")
    for file_type in ("gzip", "GZ", CompressionType.GZIP, Decompressor.types.GZIP):
        items = IterableWrapper([("noext", io.BytesIO(data))]).decompress(file_type=file_type)
        assert [s.read() for _, s in items] == [b"x"]
    assert repr(Decompressor(IterableWrapper([]), "xz")) == "Decompressor(file_type='lzma')"


def test_closing_the_decompressed_stream_closes_the_file(files):
    for path in sorted(files.iterdir()):
        raw = open(path, "rb")  # noqa: SIM115
        [(_, stream)] = list(IterableWrapper([(str(path), raw)]).decompress())
        assert stream.read(3) and not raw.closed
        stream.close()
        assert raw.closed
    lines = collect(FileLister(files).open_files("rb").decompress().readlines())
    assert len(lines) == 24  # readlines closes each decompressed stream at its end


def test_bz2_and_xz_loaders_drop_only_their_suffix():
    items = IterableWrapper(
        [("v2.bz2", io.BytesIO(bz2.compress(b"b"))), ("plain", io.BytesIO(bz2.compress(b"p")))]
    )
    assert [(p, s.read()) for p, s in items.load_from_bz2()] == [("v2", b"b"), ("plain", b"p")]
    items = IterableWrapper([("box.xz", io.BytesIO(lzma.compress(b"x")))])
    assert [(p, s.read()) for p, s in items.load_from_xz(length=1)] == [("box", b"x")]
    assert len(IterableWrapper([]).load_from_xz(length=1)) == 1
    assert repr(Bz2FileLoader(IterableWrapper([]))) == "Bz2FileLoader(length=-1)"
    assert isinstance(IterableWrapper([]).load_from_xz(), XzFileLoader)


def test_errors_say_how_to_fix():
    with pytest.raises(ValueError, match=r"cannot tell the compression of 'a\.bin'.*file_type"):
        list(IterableWrapper([("a.bin", io.BytesIO(b""))]).decompress())
    with pytest.raises(ValueError, match="file_type must be one of"):
        IterableWrapper([]).decompress(file_type="rar")
    with pytest.raises(TypeError, match=r"must be a binary stream.*open_files\(mode='rb'\)"):
        list(IterableWrapper([("a.gz", io.StringIO("x"))]).decompress())
    with pytest.raises(TypeError, match=r"load_from_bz2\(\) expects \(path, stream\) items"):
        list(IterableWrapper(["a.bz2"]).load_from_bz2())
    with pytest.raises(TypeError, match=r"pass load_from_bz2\(length=N\)"):
        len(IterableWrapper([]).load_from_bz2())
    with pytest.raises(EOFError):
        list(
            s.read()
            for _, s in IterableWrapper([("t.gz", gzip.compress(b"abc")[:-4])]).decompress()
        )


def test_resume_from_every_step(files):
    check_resume_from_every_step(
        lambda: FileLister(files).open_files("rb").decompress().readlines(decode=True)
    )


def test_same_output_everywhere(files):
    epochs = check_same_output_everywhere(
        lambda: (
            FileLister(files)
            .shuffle()
            .sharding_filter()
            .open_files("rb")
            .decompress()
            .readlines(decode=True, return_path=False)
        )
    )
    assert sorted(epochs[0]) == sorted(f"{i}:{line}" for i in range(6) for line in range(4))


def test_a_urls_query_and_fragment_are_not_part_of_its_suffix():
    signed = "https://host/d/x.tar.gz?X-Amz-Signature=abc&v=1.2#frag"  # signed cloud URLs
    items = IterableWrapper(
        [
            (signed, io.BytesIO(tar_bytes())),
            ("s3://bucket/y.gz?versionId=3", io.BytesIO(gzip.compress(b"y"))),
            ("local/what?.bz2", io.BytesIO(bz2.compress(b"w"))),  # a path: '?' is in its name
        ]
    )
    (path, tar), (_, gz), (_, bz) = list(items.decompress())
    assert path == signed and tar.getnames() == ["m.txt"]
    assert (gz.read(), bz.read()) == (b"y", b"w")
    with pytest.raises(ValueError, match=r"cannot tell the compression of 'local/x.gz\?v=1'"):
        list(IterableWrapper([("local/x.gz?v=1", io.BytesIO(b""))]).decompress())
