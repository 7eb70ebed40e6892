"""Storage readers fed damaged or hostile input, as an outside tester would.

Each test damages a well-formed file (a changed byte, a truncation, a hostile
length, a malformed protobuf; a misbehaving HTTP server on 127.0.0.1) and
checks the reader either gives exactly what was stored or raises an error
naming the file and the problem, the same under every reading service.
The tar reader has its own fuzzer (``test_tar_fuzz.py``) and the HTTP reader
its hostile server (``test_http.py``); a damaged tar.gz shard is only checked
here for the same batches and error under every service. These cover the rest:

* TFRecord: the length and the data carry masked CRC-32Cs; both are checked
  by default, so any changed byte raises (it used to come out as a changed
  feature unless ``verify_data=True``).
* gzip / bz2 / xz through ``decompress``: their CRCs and end markers catch
  damage; the error names the file (it used to be the bare ``EOFError``,
  ``BadGzipFile`` or ``LZMAError``). A flip in an unchecked gzip header
  field (mtime, OS) leaves the data as stored.
* ``.npy`` members (``decode()``): bytes after the array (a shrunk shape
  or dtype in a damaged header, or two arrays saved into one file) raise;
  ``np.load`` dropped them silently. A change that keeps the size cannot be
  seen.
* zip (``load_from_zip``): every ``zipfile`` error names the archive (a
  damaged method or size escaped as a bare ``NotImplementedError``,
  ``EOFError``, ``ValueError``), and a damaged central-directory entry no
  longer hides the members after it.
* CSV (``parse_csv``): a file that ends inside a quoted field (cut short)
  raises; Python's ``csv`` closed the field at the end of the data, so the
  last row came out short.
* HTTP: ``read_from_http()`` has ``HttpReader``'s finite 30 s timeout (it
  used to wait for a silent server until the 600 s deadline); a response
  with conflicting ``Content-Length`` headers raises instead of being cut to
  the first one. ``Content-Encoding: gzip`` bodies are never decoded (the
  bytes come as sent: no decompression bomb).
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import random
import struct
import tarfile
import threading
import zipfile
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.datapipes import FileLister, IterableWrapper
from pipeloom.datapipes._crc32c import masked_crc32c  # to write TFRecord frames
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)

# -- TFRecord ------------------------------------------------------------------------------


def _record(value: int) -> bytes:
    """An ``Example`` with one int64 feature ``x = [value]`` (value < 128)."""
    int_list = bytes([0x0A, 1, value])
    feature = bytes([0x1A, len(int_list)]) + int_list
    entry = bytes([0x0A, 1]) + b"x" + bytes([0x12, len(feature)]) + feature
    features = bytes([0x0A, len(entry)]) + entry
    return bytes([0x0A, len(features)]) + features


def _frame(record: bytes) -> bytes:
    head = struct.pack("<Q", len(record))
    return (
        head
        + struct.pack("<I", masked_crc32c(head))
        + record
        + struct.pack("<I", masked_crc32c(record))
    )


RECORDS = [_record(v) for v in (3, 5, 7, 11)]
FRAMES = [_frame(r) for r in RECORDS]
TFRECORD = b"".join(FRAMES)
BOUNDARIES = [sum(len(f) for f in FRAMES[:i]) for i in range(len(FRAMES) + 1)]


def _values(data: bytes, **kwargs) -> list[int]:
    pipe = IterableWrapper([("s.tfrecord", io.BytesIO(data))]).load_from_tfrecord(**kwargs)
    return [int(record["x"][0]) for record in pipe]


def _partial_values(data: bytes) -> tuple[list[int], Exception | None]:
    got: list[int] = []
    pipe = IterableWrapper([("s.tfrecord", io.BytesIO(data))]).load_from_tfrecord()
    try:
        for record in pipe:
            got.append(int(record["x"][0]))
    except ValueError as error:
        return got, error
    return got, None


@given(position=st.integers(0, len(TFRECORD) - 1), xor=st.integers(1, 255))
@settings(max_examples=300, deadline=None)
def test_tfrecord_any_changed_byte_raises_naming_the_file_and_record(position, xor):
    damaged = bytearray(TFRECORD)
    damaged[position] ^= xor
    got, error = _partial_values(bytes(damaged))
    index = max(i for i, start in enumerate(BOUNDARIES) if start <= position)
    assert error is not None, f"a changed byte at {position} came out as {got}"
    assert f"TFRecord file 's.tfrecord', record {index}" in str(error)
    assert got == [3, 5, 7, 11][:index]  # the records before it, exactly


MANY = [_frame(_record(i % 100)) for i in range(1500)]  # read in 2 batches of rows


@given(record=st.integers(0, len(MANY) - 1), where=st.floats(0, 1, exclude_max=True))
@settings(max_examples=40, deadline=None)
def test_tfrecord_many_records_checked_together_fail_at_the_changed_one(record, where):
    frames = list(MANY)
    damaged = bytearray(frames[record])
    damaged[int(where * len(damaged))] ^= 0x10
    frames[record] = bytes(damaged)
    got, error = _partial_values(b"".join(frames))
    assert got == [i % 100 for i in range(record)]
    assert error is not None and f"'s.tfrecord', record {record}: the " in str(error)


def test_tfrecord_a_changed_data_byte_needs_verify_data_false_to_pass():
    damaged = bytearray(TFRECORD)
    damaged[BOUNDARIES[1] + 12 + len(RECORDS[1]) - 1] ^= 0x02  # 5 -> 7, a valid record
    with pytest.raises(ValueError, match=r"'s.tfrecord', record 1: the data's checksum is wrong"):
        _values(bytes(damaged))
    assert _values(bytes(damaged), verify_data=False) == [3, 7, 7, 11]


@pytest.mark.parametrize("end", range(len(TFRECORD)))
def test_tfrecord_cut_anywhere_raises_unless_cut_between_records(end):
    got, error = _partial_values(TFRECORD[:end])
    whole = sum(1 for b in BOUNDARIES[1:] if b <= end)
    assert got == [3, 5, 7, 11][:whole]
    if end in BOUNDARIES:
        assert error is None
    else:
        assert error is not None and f"'s.tfrecord', record {whole}: the file ends" in str(error)


@given(seed=st.integers(0, 2**32 - 1), changes=st.integers(1, 4))
@settings(max_examples=400, deadline=None)
def test_tfrecord_malformed_protobuf_with_valid_checksums_raises_value_error(seed, changes):
    # The frame is intact (a writer bug, not bit rot): the protobuf parser must still
    # refuse with ValueError naming the record, never TypeError/struct.error/OverflowError.
    rng = random.Random(seed)
    record = bytearray(RECORDS[0])
    for _ in range(changes):
        record[rng.randrange(len(record))] = rng.randrange(256)
    data = FRAMES[1] + _frame(bytes(record))
    pipe = IterableWrapper([("p.tfrecord", io.BytesIO(data))]).load_from_tfrecord()
    try:
        list(pipe)
    except ValueError as error:
        assert "TFRecord file 'p.tfrecord', record 1: " in str(error)


@pytest.mark.parametrize(
    "record, message",
    [
        (bytes([0x08, 0x01]), "the record's features has wire type 0"),  # features as a varint
        (bytes([0x0A, 2, 0x09, 0x01]), "a fixed-width field runs past the end"),
        (bytes([0x0A, 11]) + bytes([0x08] + [0xFF] * 9 + [0x7F]), "larger than 64 bits"),
    ],
)
def test_tfrecord_protobuf_errors_that_escaped_as_other_types(record, message):
    with pytest.raises(ValueError, match=r"'p.tfrecord', record 0: .*" + message):
        list(IterableWrapper([("p.tfrecord", io.BytesIO(_frame(record)))]).load_from_tfrecord())


def test_tfrecord_a_huge_length_with_a_valid_checksum_raises_without_allocating(tmp_path):
    head = struct.pack("<Q", 1 << 40)  # 1 TiB: read(1 << 40) raised a bare MemoryError
    path = tmp_path / "huge.tfrecord"
    path.write_bytes(head + struct.pack("<I", masked_crc32c(head)) + b"tiny")
    pipe = FileLister(str(tmp_path), masks="*.tfrecord").open_files("rb").load_from_tfrecord()
    with pytest.raises(ValueError, match=r"huge.tfrecord', record 0: the file ends inside"):
        list(pipe)


# -- gzip / bz2 / xz -----------------------------------------------------------------------

PLAIN = b"".join(b"line %d of the file\n" % i for i in range(200))
COMPRESSED = {
    "gz": gzip.compress(PLAIN, mtime=0),
    "bz2": bz2.compress(PLAIN),
    "xz": lzma.compress(PLAIN),
}


def _decompress(name: str, data: bytes) -> bytes:
    [(path, stream)] = list(IterableWrapper([(name, io.BytesIO(data))]).decompress())
    with stream:
        return stream.read()


@given(
    kind=st.sampled_from(sorted(COMPRESSED)),
    where=st.floats(0, 1, exclude_max=True),
    xor=st.integers(1, 255),
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_changed_compressed_byte_raises_naming_the_file_or_changes_nothing(kind, where, xor):
    data = bytearray(COMPRESSED[kind])
    data[int(where * len(data))] ^= xor
    name = f"d/notes.txt.{kind}"
    try:
        out = _decompress(name, bytes(data))
    except (EOFError, OSError, lzma.LZMAError, zlib.error) as error:
        assert f"cannot decompress {name!r}" in str(error)
    else:
        assert out == PLAIN  # e.g. gzip's mtime or OS byte: not covered by its CRC


@pytest.mark.parametrize("kind", sorted(COMPRESSED))
def test_a_truncated_compressed_file_raises_naming_the_file(kind):
    data = COMPRESSED[kind]
    # 0: GzipFile read an empty file as empty data (bz2 and xz raised): a copy that
    # failed before its first byte came out as an empty file, silently.
    for end in sorted({0, 1, len(data) // 3, len(data) // 2, len(data) - 8, len(data) - 1}):
        with pytest.raises((EOFError, OSError), match=rf"cannot decompress 'n\.{kind}'"):
            _decompress(f"n.{kind}", data[:end])


def test_the_error_of_the_stream_under_it_keeps_its_own_message():
    class Broken(io.RawIOBase):
        def readable(self):
            return True

        def readinto(self, buffer):
            raise ConnectionResetError("GET http://h/n.gz: connection reset at byte 10")

    [(path, stream)] = list(IterableWrapper([("http://h/n.gz", Broken())]).decompress())
    with pytest.raises(ConnectionResetError, match=r"^GET http://h/n.gz: connection reset"):
        stream.read()


# -- zip archives --------------------------------------------------------------------------


def _zip_bytes() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for i in range(3):
            archive.writestr(f"m{i}.txt", b"member %d " % i * 50)
    return buffer.getvalue()


ZIP = _zip_bytes()


def _zip_members(data: bytes) -> list[tuple[str, bytes]]:
    files = IterableWrapper([("a.zip", io.BytesIO(data))])
    return [(path, stream.read()) for path, stream in files.load_from_zip()]


ZIP_MEMBERS = _zip_members(ZIP)


@given(position=st.integers(0, len(ZIP) - 1), xor=st.integers(1, 255))
@settings(max_examples=400, deadline=None)
def test_a_changed_zip_byte_raises_naming_the_archive_or_changes_nothing(position, xor):
    damaged = bytearray(ZIP)
    damaged[position] ^= xor
    try:
        members = _zip_members(bytes(damaged))
    except zipfile.BadZipFile as error:
        assert "'a.zip'" in str(error)
    else:  # e.g. a file's time or attributes: no member is lost or changed
        assert members == ZIP_MEMBERS


@pytest.mark.parametrize(
    "xor, message",
    [
        (ord("m"), "empty name"),  # 'm0.txt' -> '\x000.txt': zipfile cuts the name at the NUL
        (ord("t") ^ ord("/"), "named as a directory but holds"),  # 'm0.txt' -> 'm0.tx/'
    ],
)
def test_a_damaged_zip_member_name_never_hides_the_member(xor, message):
    name = ZIP.index(b"PK\x01\x02") + 46  # the first central directory entry's name
    damaged = bytearray(ZIP)
    damaged[name + (0 if message == "empty name" else 5)] ^= xor
    with pytest.raises(zipfile.BadZipFile, match=f"'a.zip'.*{message}"):
        _zip_members(bytes(damaged))


def test_a_damaged_zip_central_directory_entry_never_drops_the_members_after_it():
    directory = ZIP.index(b"PK\x01\x02")
    damaged = bytearray(ZIP)
    damaged[directory + 33] ^= 0x01  # the first entry's comment length +256: it swallows the rest
    with pytest.raises(zipfile.BadZipFile, match=r"'a.zip': its end record lists 3 member\(s\)"):
        _zip_members(bytes(damaged))


@pytest.mark.parametrize(
    "field, value, error",
    [
        (8, b"\x63\x00", "NotImplementedError"),  # the compression method: unknown
        (18, b"\x05\x00\x00\x00", "zlib.error|EOFError|Bad CRC"),  # compressed size: cut
    ],
)
def test_zip_errors_that_escaped_without_the_archive_name(field, value, error):
    damaged = bytearray(ZIP)
    damaged[field : field + len(value)] = value  # the first member's local header
    directory = ZIP.index(b"PK\x01\x02")
    damaged[directory + field + 2 : directory + field + 2 + len(value)] = value  # and its entry
    with pytest.raises(
        zipfile.BadZipFile, match=rf"zip archive 'a.zip': member 'm0.txt'.*({error})"
    ):
        _zip_members(bytes(damaged))


# -- CSV ----------------------------------------------------------------------------------

CSV = b'id,text\n1,"plain"\n2,"a, comma"\n3,"two\nlines"\n4,"a ""quote"""\n'
CSV_ROWS = [
    ["id", "text"],
    ["1", "plain"],
    ["2", "a, comma"],
    ["3", "two\nlines"],
    ["4", 'a "quote"'],
]


def _csv_rows(data: bytes, **kwargs) -> list:
    return list(IterableWrapper([("t.csv", io.BytesIO(data))]).parse_csv(**kwargs))


@pytest.mark.parametrize("end", range(len(CSV) + 1))
def test_a_csv_cut_inside_a_quoted_field_raises_never_a_short_row(end):
    cut = CSV[:end]
    # Python's csv (strict=False) ends a quoted field at the end of the data, so a
    # file cut at '2,"a, com' gave the row ['2', 'a, com'] silently.
    quotes_open = cut.count(b'"') % 2 == 1
    if quotes_open:
        with pytest.raises(ValueError, match=r"'t.csv': the file ends \(line \d+\) inside a quot"):
            _csv_rows(cut)
        with pytest.raises(ValueError, match=r"inside a quoted field"):
            _csv_rows(cut, as_dict=True)
    else:
        rows = _csv_rows(cut)
        whole = rows if cut.endswith(b"\n") else rows[:-1]
        assert whole == CSV_ROWS[: len(whole)]


def test_csv_ends_that_are_not_cuts_keep_their_rows():
    assert _csv_rows(b"a,b\n1,2") == [["a", "b"], ["1", "2"]]  # no final newline
    assert _csv_rows(b"") == [] and _csv_rows(b"", as_dict=True) == []
    assert _csv_rows(b"a,b\n1,2\n", as_dict=True) == [{"a": "1", "b": "2"}]
    assert _csv_rows(b"x\n\n") == [["x"], []]
    assert _csv_rows(b"a,b\n1,2\n3,4\n", skip_lines=1) == [["1", "2"], ["3", "4"]]


# -- .npy members ----------------------------------------------------------------------------

ARRAY = np.arange(12, dtype=np.float32).reshape(3, 4)


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


NPY = _npy_bytes(ARRAY)


def _decode_npy(data: bytes):
    [(_, value)] = list(IterableWrapper([("s.tar/k.npy", data)]).decode())
    return value


@given(position=st.integers(0, len(NPY) - ARRAY.nbytes - 1), xor=st.integers(1, 255))
@settings(max_examples=300, deadline=None)
def test_a_changed_npy_header_byte_raises_naming_the_member_or_gives_a_same_size_array(
    position, xor
):
    damaged = bytearray(NPY)
    damaged[position] ^= xor
    try:
        value = _decode_npy(bytes(damaged))
    except ValueError as error:
        assert "decoding 's.tar/k.npy' with the '.npy' decoder" in str(error)
    else:
        # What no reader can see: a change that keeps the size (a shape (4, 3) or
        # (2, 6), a dtype '<i4' or '>f4') reinterprets the same bytes.
        assert value.nbytes == ARRAY.nbytes and value.tobytes() == ARRAY.tobytes()


@pytest.mark.parametrize(
    "data, message",
    [
        (NPY + b"\0\0", r"2 byte\(s\) follow the array \(shape \(3, 4\), dtype float32\)"),
        (NPY.replace(b"(3, 4)", b"(3, 1)"), r"36 byte\(s\) follow the array \(shape \(3, 1\)"),
        (NPY.replace(b"'<f4'", b"'<f2'"), r"24 byte\(s\) follow the array"),
        (NPY + _npy_bytes(ARRAY), r"several arrays were saved into it"),
        (NPY[:-5], r"EOF: reading array data, expected 48 bytes got 43"),
    ],
    ids=["trailing-bytes", "shape-shrunk", "dtype-shrunk", "two-arrays", "truncated"],
)
def test_npy_bytes_the_array_does_not_account_for_raise(data, message):
    # np.load ignores bytes after the array: a shrunk shape or dtype gave a silently
    # smaller array, and a second array saved into the same file was dropped.
    with pytest.raises(ValueError, match=r"decoding 's.tar/k.npy' .*" + message):
        _decode_npy(data)


# -- the same under every reading service --------------------------------------------------

SERVICES = {
    "in-process": InProcessReadingService,
    "threads": lambda: ThreadReadingService(2),
    "processes": lambda: MultiProcessingReadingService(2, start_method="fork", timeout=60),
}


def _first_value(record):
    return int(record["x"][0])


def _label(sample):
    return int(sample["cls"])


def _run(pipe, service) -> tuple[list, str]:
    got = []
    with DataLoader(pipe, service, seed=0) as loader:
        try:
            for batch in loader:
                got.append(batch)
        except Exception as error:  # noqa: BLE001 - compared below
            return got, f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return got, "no error"


@pytest.fixture
def damaged_files(tmp_path):
    for shard in range(4):
        frames = [_frame(_record(10 * shard + i)) for i in range(5)]
        data = bytearray(b"".join(frames))
        if shard == 2:
            data[3 * len(frames[0]) - 5] ^= 0x40  # the data of record 2
        (tmp_path / f"s{shard}.tfrecord").write_bytes(bytes(data))
        text = b"".join(b"%d\n" % (10 * shard + i) for i in range(5))
        gz = gzip.compress(text, mtime=0)
        (tmp_path / f"s{shard}.txt.gz").write_bytes(gz[: len(gz) - 6] if shard == 2 else gz)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for i in range(3):
                for ext, payload in ((".cls", b"%d" % (10 * shard + i)), (".txt", b"x" * 700)):
                    info = tarfile.TarInfo(f"s{shard}_{i}{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
        shard_gz = bytearray(gzip.compress(buffer.getvalue(), compresslevel=0, mtime=0))
        if shard == 2:
            shard_gz[len(shard_gz) // 2] ^= 1  # stored: a flip in a member's data
        (tmp_path / f"s{shard}.tar.gz").write_bytes(bytes(shard_gz))
    return tmp_path


@pytest.mark.parametrize("service", sorted(SERVICES))
@pytest.mark.timeout(120)
def test_a_damaged_file_gives_the_same_batches_and_error_under_every_service(
    damaged_files, service
):
    root = str(damaged_files)
    records = (FileLister(root, masks="*.tfrecord").open_files("rb").load_from_tfrecord()).map(
        _first_value
    )
    lines = FileLister(root, masks="*.txt.gz").open_files("rb").decompress().readlines()
    got_records = _run(records.batch(2), SERVICES[service]())
    got_lines = _run(lines.map(lambda item: int(item[1])).batch(2), SERVICES[service]())
    assert got_records == (
        [[0, 1], [2, 3], [4, 10], [11, 12], [13, 14], [20, 21]],
        f"ValueError: TFRecord file '{root}/s2.tfrecord', record 2: the data's checksum is "
        f"wrong: corrupted data",
    )
    samples = FileLister(root, masks="*.tar.gz").open_files("rb").load_from_tar().webdataset()
    batches, error = _run(samples.map(_label).batch(2), SERVICES[service]())
    # The shard's gzip CRC is checked at its end: its first samples came before (the
    # message says they may be damaged), the same under every service.
    assert batches == [[0, 1], [2, 10], [11, 12], [20, 21]]
    assert error.startswith(f"ReadError: tar shard '{root}/s2.tar.gz' is corrupted or truncated")
    assert "CRC check failed" in error
    assert got_lines == (
        [[0, 1], [2, 3], [4, 10], [11, 12], [13, 14]],  # s2 is read in one 8 KiB piece
        f"EOFError: cannot decompress '{root}/s2.txt.gz' (gzip): Compressed file ended before "
        f"the end-of-stream marker was reached; the file is truncated",
    )


# -- HTTP ----------------------------------------------------------------------------------


class _Hostile(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):  # noqa: N802 - the http.server name
        if self.path == "/two-lengths":
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.send_header("Content-Length", "10")
            self.end_headers()
            self.wfile.write(b"helloworld")
        elif self.path == "/gzip-encoded":
            body = gzip.compress(b"\0" * 1_000_000)
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/silent":  # the status line, then nothing until released
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            self.wfile.flush()
            self.server.release.wait(20)
        self.close_connection = True


@pytest.fixture
def hostile():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.daemon_threads = True
    server.release = threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.release.set()
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_read_from_http_has_a_finite_timeout_by_default():
    reader = IterableWrapper([]).read_from_http()
    assert reader.timeout == 30.0 and reader.deadline == 600.0


@pytest.mark.timeout(60)
def test_a_silent_server_hits_the_functional_timeout_naming_the_url(hostile):
    urls = IterableWrapper([f"{hostile}/silent"])
    with pytest.raises(TimeoutError, match=rf"GET {hostile}/silent: no data for 0.5 s"):
        list(urls.read_from_http(timeout=0.5, retries=1, backoff=0.01))


def test_conflicting_content_lengths_raise_instead_of_a_cut_file(hostile):
    urls = IterableWrapper([f"{hostile}/two-lengths"])
    with pytest.raises(OSError, match=r"two-lengths: the response has conflicting Content-Len"):
        [stream.read() for _, stream in urls.read_from_http(timeout=5, retries=0)]


def test_a_gzip_encoded_body_comes_as_sent_never_decoded(hostile):
    urls = IterableWrapper([f"{hostile}/gzip-encoded"])
    [body] = [stream.read() for _, stream in urls.read_from_http(timeout=5)]
    assert body[:2] == b"\x1f\x8b" and len(body) < 10_000
    assert gzip.decompress(body) == b"\0" * 1_000_000
