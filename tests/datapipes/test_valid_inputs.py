"""Readers on VALID but unusual input, judged against the standard library as the oracle.

Damaged input is attacked in test_reader_attacks.py and test_tar_fuzz.py; here
every file is well formed, as writers in the wild produce them, and each
reader must give exactly what ``tarfile``, ``zipfile``, ``np.load``, ``csv``
or ``open()`` give: no item lost, merged, split, renamed or changed.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import lzma
import struct
import tarfile
import warnings
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import FileLister, IterableWrapper
from pipeloom.datapipes._crc32c import SMALL_INPUT, masked_crc32c


class _RawStream(io.RawIOBase):
    """A readable raw stream (a pipe, a socket) whose reads return at most ``most`` bytes."""

    def __init__(self, data: bytes, most: int = 3) -> None:
        self._data, self._most = io.BytesIO(data), most

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._data.readinto(memoryview(buffer)[: self._most])


# -- tar -------------------------------------------------------------------------------------


def _tar(tar_format: int) -> bytes:
    """Members that tarfile writes with ustar prefixes, GNU long names/links or pax records."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tar_format) as tar:

        def add(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = ""):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            info.size = len(data) if kind in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
            tar.addfile(info, io.BytesIO(data))

        add("a.txt", b"hello")
        add("empty.txt")
        add("block.bin", b"x" * 512)  # an exact multiple of the block size
        add("dir", kind=tarfile.DIRTYPE)
        add("dir/sym", kind=tarfile.SYMTYPE, link="../a.txt")
        # hard links need a stream that seeks back: see test_tar.py
        add("old-style", b"v7", kind=tarfile.AREGTYPE)
        add("p/" * 40 + "prefixed.txt", b"ustar prefix")  # 80 + 12 characters
        add("n" * 100, b"a name of exactly 100 characters")
        if tar_format != tarfile.USTAR_FORMAT:
            add("d/" * 70 + "long.txt", b"long")
            add("ü/çødé 日本.txt", "ü".encode())
            add("link", kind=tarfile.SYMTYPE, link="L" * 300)
            add("after.txt", b"after the long link")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("tar_format", "compress"),
    [
        (tarfile.USTAR_FORMAT, None),
        (tarfile.GNU_FORMAT, "gz"),
        (tarfile.PAX_FORMAT, "xz"),
        (tarfile.PAX_FORMAT, "bz2"),
    ],
)
def test_tar_members_are_tarfiles_from_a_raw_stream(tar_format, compress):
    data = _tar(tar_format)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        want = [(m.name, tar.extractfile(m).read()) for m in tar if m.isfile()]
    if compress is not None:  # in two members/streams, as parallel compressors write them
        module = {"gz": gzip, "xz": lzma, "bz2": bz2}[compress]
        data = module.compress(data[:700]) + module.compress(data[700:])
    pipe = IterableWrapper([("s.tar", _RawStream(data, most=333))]).load_from_tar()
    assert [(path.member, member) for path, member in pipe] == want


def _incremental_tar() -> bytes:
    """An archive as GNU tar -g writes it: old GNU headers keep the access and change times
    at byte 345, where POSIX ustar headers have the name prefix."""
    blocks = []

    def member(name: str, data: bytes, sparse: int | None = None) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        if sparse is not None:
            info.type = tarfile.GNUTYPE_SPARSE
        header = bytearray(info.tobuf(tarfile.GNU_FORMAT))
        header[345:369] = b"%011o\0%011o\0" % (1_700_000_000, 1_700_000_001)  # atime, ctime
        if sparse is not None:  # one data chunk at offset 0, then a hole: ``sparse`` bytes
            header[386:410] = b"%011o\0%011o\0" % (0, len(data))
            header[483:495] = b"%011o\0" % sparse
        header[148:156] = b" " * 8
        header[148:156] = b"%06o\0 " % sum(header)
        blocks.append(bytes(header) + data + bytes(-len(data) % 512))

    member("a.txt", b"hello")
    member("holes.bin", b"data", sparse=10_000)  # read by tarfile, and all after it
    member("dir/b.txt", b"after the sparse member")
    return b"".join(blocks) + bytes(1024)


def test_gnu_incremental_archive_names_are_gnu_tars():
    # GNU tar -tf lists a.txt, holes.bin and dir/b.txt; tarfile read the times as a name
    # prefix: "14524770400/a.txt". So did load_from_tar, in both of its readers.
    pipe = IterableWrapper([("s.tar", _incremental_tar())]).load_from_tar()
    got = [(path.member, data) for path, data in pipe]
    assert got == [
        ("a.txt", b"hello"),
        ("holes.bin", b"data" + bytes(10_000 - 4)),
        ("dir/b.txt", b"after the sparse member"),
    ]


def test_xz_stream_padding_is_read_as_xz_reads_it():
    """The xz format allows zero bytes (a multiple of 4) between and after streams; xz -d
    reads them. lzma.LZMAFile took them for a cut stream: an error at the end, and the
    streams after padding were dropped silently."""
    first, second = b"".join(b"%d," % i for i in range(3000)), b"the second stream"
    data = lzma.compress(first) + bytes(8) + lzma.compress(second) + bytes(4)
    [(name, stream)] = list(IterableWrapper([("p.txt.xz", data)]).load_from_xz())
    assert (name, stream.read()) == ("p.txt", first + second)
    shard = _tar(tarfile.PAX_FORMAT)
    data = lzma.compress(shard[:1000]) + bytes(12) + lzma.compress(shard[1000:]) + bytes(4)
    pipe = IterableWrapper([("s.tar.xz", _RawStream(data, most=333))]).load_from_tar()
    with tarfile.open(fileobj=io.BytesIO(shard)) as tar:
        assert [path.member for path, _ in pipe] == [m.name for m in tar if m.isfile()]
    bad = lzma.compress(first) + bytes(3)  # xz -d: "Compressed data is corrupt"
    with pytest.raises(lzma.LZMAError, match="'b.xz'.*3 zero byte.*multiple of 4"):
        [(_, stream)] = list(IterableWrapper([("b.xz", bad)]).load_from_xz())
        stream.read()


@pytest.mark.parametrize(
    ("kind", "compress", "error"),
    [("xz", lzma.compress, lzma.LZMAError), ("bz2", bz2.compress, OSError)],
)
def test_a_damaged_later_stream_raises(kind, compress, error):
    """lzma.LZMAFile and bz2.BZ2File took a later stream whose magic bytes were damaged for
    trailing data and dropped it: the file (or tar shard) read as its first stream alone.
    xz -d: "Compressed data is corrupt"."""
    first = compress(b"first stream\n")
    damaged = first + b"X" + compress(b"second stream\n")[1:]
    for data in (damaged, first + b"trailing text"):
        files = IterableWrapper([(f"d.txt.{kind}", data)])
        [(_, stream)] = list(files.load_from_xz() if kind == "xz" else files.load_from_bz2())
        with pytest.raises(error, match=f"'d.txt.{kind}'.*after {kind} stream 1 are not another"):
            stream.read()
    shard = _tar(tarfile.PAX_FORMAT)
    data = compress(shard[:1024]) + b"X" + compress(shard[1024:])[1:]
    with pytest.raises(tarfile.ReadError, match=f"after {kind} stream 1 are not another"):
        list(IterableWrapper([(f"s.tar.{kind}", data)]).load_from_tar())


@pytest.mark.parametrize("name", ["shard#1.tar", "a?b.tar", "x;y.tar", "100%.tar"])
def test_webdataset_local_path_is_the_shards_path(tmp_path, name):
    with tarfile.open(tmp_path / name, "w") as tar:
        info = tarfile.TarInfo("0001.cls")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"7"))
    pipe = FileLister(str(tmp_path)).open_files("rb").load_from_tar().webdataset()
    [sample] = list(pipe)
    # The path was parsed as a URL: "shard#1.tar" gave "shard" ("#1.tar" a fragment).
    path = str(tmp_path / name)
    assert (sample["__url__"], sample["__local_path__"]) == (path, path)


# -- zip -------------------------------------------------------------------------------------

_ZIP_NAMES = ["a.txt", "./dot.txt", "x/../y.txt", "a//b.txt", "/abs.txt", "dir/", "ü/ç.txt"]


def _zip(method: int, *, zip64: bool, streamed: bool) -> bytes:
    """A zip archive of ``_ZIP_NAMES``; ``streamed`` writes it to a non-seekable file,
    so each member has a data descriptor."""
    sink = io.BytesIO()
    target = _RawSink(sink) if streamed else sink
    with zipfile.ZipFile(target, "w", compression=method) as archive:
        archive.comment = b"an archive comment"
        for index, name in enumerate(_ZIP_NAMES):
            if name.endswith("/"):
                archive.writestr(zipfile.ZipInfo(name), b"")
                continue
            with archive.open(zipfile.ZipInfo(name), "w", force_zip64=zip64) as member:
                member.write(str(index).encode() * 300)
    return sink.getvalue()


class _RawSink(io.RawIOBase):
    """A write-only stream that cannot seek or tell (a pipe)."""

    def __init__(self, sink: io.BytesIO) -> None:
        self._sink = sink

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        return self._sink.write(data)


@pytest.mark.parametrize(
    ("method", "zip64", "streamed"),
    [
        (zipfile.ZIP_STORED, False, False),
        (zipfile.ZIP_DEFLATED, True, True),
        (zipfile.ZIP_BZIP2, False, True),
        (zipfile.ZIP_LZMA, True, False),
    ],
)
def test_zip_members_keep_their_stored_names_and_bytes(method, zip64, streamed):
    data = _zip(method, zip64=zip64, streamed=streamed)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        want = [
            (f"https://host/d.zip/{info.filename}", archive.read(info))
            for info in archive.infolist()
            if not info.is_dir()
        ]
    pipe = IterableWrapper([("https://host/d.zip", data)]).load_from_zip()
    got = [(path, stream.read()) for path, stream in pipe]
    # os.path.normpath made "./dot.txt" "dot.txt", "a//b.txt" "a/b.txt", "/abs.txt" lost the
    # archive, and "https://" became "https:/".
    assert got == want


def _zip_without_zip64(count: int) -> bytes:
    """A zip of ``count`` empty stored members, written as writers without ZIP64 write it:
    the 16-bit member counts of its end record hold ``count`` modulo 65536."""
    local, central, offset = [], [], 0
    for index in range(count):
        name = b"%d" % index
        head = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, 0, 0, len(name), 0)
        local.append(head + name)
        fields = (20, 20, *[0] * 7, len(name), *[0] * 5, offset)  # made by, ..., at offset
        entry = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", *fields)
        central.append(entry + name)
        offset += len(local[-1])
    directory = b"".join(central)
    wrapped = count & 0xFFFF
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, wrapped, wrapped, len(directory), offset, 0)
    return b"".join(local) + directory + end


def test_zip_of_more_than_65535_members_without_zip64_is_read_whole():
    data = _zip_without_zip64(65_537)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert len(archive.infolist()) == 65_537
    # The end record's count (1) was compared with the directory's (65537): "damaged".
    names = [path for path, _ in IterableWrapper([("w.zip", data)]).load_from_zip()]
    assert names[:2] == ["w.zip/0", "w.zip/1"]
    assert len(names) == 65_537 and names[-1] == "w.zip/65536"


# -- .npy ------------------------------------------------------------------------------------


def _npy_cases() -> dict[str, np.ndarray]:
    return {
        "fortran": np.asfortranarray(np.arange(24, dtype=np.int16).reshape(2, 3, 4)),
        "big-endian": np.arange(5, dtype=">f8"),
        "0-d": np.array(3.5),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "structured": np.array([(1, 2.0, b"ab")], dtype=[("a", "<i4"), ("b", ">f8"), ("c", "S2")]),
        "nested": np.zeros(2, dtype=[("a", "<f4", (2, 3)), ("n", [("x", "i1")])]),
        "unicode strings": np.array(["héllo", "x"]),
        # NumPy writes format 3.0 (a UTF-8 header) for these; 1.0 and 2.0 are latin-1.
        "unicode field names": np.array([(1, 2.5)], dtype=[("ü", "<i4"), ("名", "<f4")]),
    }


@pytest.mark.parametrize("name", sorted(_npy_cases()))
def test_npy_decodes_as_np_load_does(name):
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Stored array in format 3.0"
        np.save(buffer, _npy_cases()[name])
    data = buffer.getvalue()
    want = np.load(io.BytesIO(data))
    ((_, got),) = list(IterableWrapper([("x.npy", data)]).decode())
    # The header of format 3.0 was read as latin-1: the field names came out as mojibake.
    assert (got.dtype, got.shape, got.flags.f_contiguous) == (
        want.dtype,
        want.shape,
        want.flags.f_contiguous,
    )
    assert got.tobytes() == want.tobytes()  # none of these dtypes has padding bytes


# -- TFRecord --------------------------------------------------------------------------------


def _length_delimited(number: int, payload: bytes) -> bytes:
    def varint(value: int) -> bytes:
        out = bytearray()
        while value > 0x7F:
            out.append(value & 0x7F | 0x80)
            value >>= 7
        return bytes(out) + bytes([value])

    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _tfrecord(values: list[bytes | None]) -> bytes:
    """Frames of ``Example`` records ``{"x": bytes_list [value]}`` (None: an empty record)."""
    frames = []
    for value in values:
        record = b""
        if value is not None:
            feature = _length_delimited(1, _length_delimited(1, value))
            entry = _length_delimited(1, b"x") + _length_delimited(2, feature)
            record = _length_delimited(1, _length_delimited(1, entry))
        head = struct.pack("<Q", len(record))
        frames += [head, struct.pack("<I", masked_crc32c(head)), record]
        frames.append(struct.pack("<I", masked_crc32c(record)))
    return b"".join(frames)


@pytest.mark.parametrize("raw", [False, True], ids=["buffered", "short reads"])
def test_tfrecord_reads_every_record_of_a_valid_file(raw):
    # Empty records, and records around the size where the read-ahead stops (SMALL_INPUT).
    values = [None, b"", b"a", None, b"b" * (SMALL_INPUT - 30), b"c" * SMALL_INPUT, b"d" * 70_000]
    data = _tfrecord(values)
    stream = _RawStream(data, most=1000) if raw else io.BytesIO(data)
    got = list(IterableWrapper([("f.tfrecord", stream)]).load_from_tfrecord())
    # A raw stream (a pipe, a socket) returns short reads: a short read of a record's length
    # was taken for "the file ends inside a record's length".
    assert got == [{} if value is None else {"x": [value]} for value in values]


# -- lines and CSV ---------------------------------------------------------------------------


def test_csv_with_lone_cr_line_ends_reads_as_csv_does():
    # "CSV (Macintosh)" from old spreadsheets ends lines with "\r" alone; from bytes (a tar
    # or zip member, a binary stream) the whole file was one line: "new-line character
    # seen in unquoted field".
    data = b'name,n\rx,1\r"y\rz",2\r'
    want = list(csv.reader(io.TextIOWrapper(io.BytesIO(data), newline="")))
    assert want == [["name", "n"], ["x", "1"], ["y\rz", "2"]]
    got = list(IterableWrapper([("s.tar/m.csv", data)]).parse_csv(skip_lines=1))
    assert got == want[1:]


def test_utf16_text_is_decoded_as_one_text():
    # Excel's "Unicode Text": UTF-16 with a BOM, tab-separated, "\r\n". Each bytes line ended
    # at the byte 0x0A, the first half of the UTF-16 newline: every later line was shifted.
    text = "name\tcity\r\n1\tZürich\r\n2\t東京\r\n"
    data = text.encode("utf-16")
    rows = IterableWrapper([("u.txt", data)]).parse_csv(encoding="utf-16", delimiter="\t")
    assert list(rows) == [["name", "city"], ["1", "Zürich"], ["2", "東京"]]
    lines = IterableWrapper([("u.txt", data)]).readlines(decode=True, encoding="utf-16")
    assert [line for _, line in lines] == ["name\tcity", "1\tZürich", "2\t東京"]


_TEXT = st.text(st.sampled_from(list('ab,"\r\n\té€𝄞')), max_size=30)
_ENCODINGS = st.sampled_from(["utf-8", "utf-16", "utf-32-le", "utf-8-sig", "cp1252"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_TEXT, encoding=_ENCODINGS, most=st.integers(1, 9))
def test_lines_and_rows_are_those_of_open(text, encoding, most):
    """Any text, encoding and read size (a "\\r\\n" or a character cut between two reads):
    readlines() gives the lines of open(newline="\\n"), parse_csv() the rows of csv over
    open(newline="")."""
    data = text.encode(encoding, errors="ignore")

    def opened(newline: str) -> io.TextIOWrapper:
        return io.TextIOWrapper(io.BytesIO(data), encoding=encoding, newline=newline)

    def stream() -> IterableWrapper:
        return IterableWrapper([("f", _RawStream(data, most))])

    lines = stream().readlines(
        decode=True, encoding=encoding, errors="strict", strip_newline=False, return_path=False
    )
    assert list(lines) == list(opened("\n"))
    try:
        want = list(csv.reader(opened("")))
    except csv.Error:  # a quote inside an unquoted field: not CSV
        return
    try:
        got = list(stream().parse_csv(encoding=encoding, errors="strict"))
    except ValueError as error:  # documented: a file ending inside a quoted field raises
        assert "ends (line" in str(error)
        return
    assert got == want


def test_read_from_stream_gives_chunk_sized_reads_of_a_raw_stream():
    data = bytes(range(256)) * 4
    chunks = IterableWrapper([("p", _RawStream(data, most=7))]).read_from_stream(chunk=100)
    got = [chunk for _, chunk in chunks]
    # A raw stream returned 7 bytes a read: 147 chunks of 7 bytes, not 11 of (at most) 100.
    assert got == [data[i : i + 100] for i in range(0, len(data), 100)]
