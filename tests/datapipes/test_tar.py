"""TarArchiveLoader: streamed tar shards, strict about truncation, resumable mid-shard."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import pickle
import random
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import (
    FileLister,
    IterableWrapper,
    IterDataPipe,
    NotAvailable,
    TarArchiveLoader,
    TarMemberPath,
    reset_pipeline,
)
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
    with pytest.raises(
        tarfile.ReadError, match=r"tar shard 'bad.tar' is corrupted or truncated.*byte offset \d+"
    ):
        list(loader)


def test_missing_end_marker_is_truncation_not_a_silent_end():
    data = tar_bytes([("a", b"x"), ("b", b"y")])
    cut = data[: 512 * 2]  # header + data of "a", then nothing
    with pytest.raises(tarfile.ReadError, match=r"after 1 member\(s\)"):
        list(TarArchiveLoader(IterableWrapper([("cut.tar", io.BytesIO(cut))])))


def test_corrupted_header_raises():
    data = bytearray(tar_bytes([("a", b"x"), ("b", b"y")]))
    data[1024 : 1024 + 100] = b"\xff" * 100  # scramble the second header
    with pytest.raises(tarfile.ReadError, match="invalid member header"):
        list(TarArchiveLoader(IterableWrapper([("bad.tar", io.BytesIO(bytes(data)))])))


def _with_checksum_field(data: bytes, field: bytes) -> bytes:
    return data[:148] + field + data[156:]


def test_a_checksum_field_is_read_as_gnu_tar_reads_it_not_as_int_does():
    """Octal digits after any spaces, then a NUL, a space or the field's end: the ways
    writers spell it. int() also took "+", "_", "0o" and tabs, so more changed bytes
    of the one header field its sum skips passed unseen."""
    data = tar_bytes([("a.txt", b"hi")])
    six = b"%06o" % (sum(data[:148]) + 256 + sum(data[156:512]))
    assert data[148:156] == six + b"\0 " and six.startswith(b"00")
    for same in (b" " + six[1:] + b"\0 ", six + b"  ", six + b"\0x", b"  " + six[2:] + b"  "):
        assert load(_with_checksum_field(data, same)) == [("h.tar/a.txt", b"hi")], same
    for lenient in (b"+", b"\t", b"\x0b", b"0o", b"0_"):
        field = lenient + six[len(lenient) :] + b"\0 "
        assert int(field[:6], 8) == int(six, 8)  # what int() made of it: the same
        with pytest.raises(tarfile.ReadError, match=r"'h.tar' .*checksum field .*expected octal"):
            load(_with_checksum_field(data, field))


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
        assert (
            len(
                collect(FileLister(shards, "*.tar").open_files("rb").load_from_tar(on_error="warn"))
            )
            == 10
        )


def test_error_closes_the_shard_stream(tmp_path):
    (tmp_path / "x.tar").write_bytes(b"garbage" * 200)
    opener = FileLister(tmp_path).open_files("rb")
    with pytest.raises(tarfile.ReadError):
        list(opener.load_from_tar())
    assert all(stream.closed for _, _, stream in opener._handed)


def test_resumes_from_every_step_inside_shards(shards):
    check_resume_from_every_step(
        lambda: FileLister(shards, "*.tar").open_files("rb").load_from_tar()
    )


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
    with pytest.raises(ValueError, match=r"length must be an int >= 0, or -1 .* got -2"):
        TarArchiveLoader(source, length=-2)
    with pytest.raises(ValueError, match=r"max_member_size must be a number of bytes >= 0"):
        TarArchiveLoader(source, max_member_size=-1)
    assert repr(TarArchiveLoader(source)) == "TarArchiveLoader(mode='r|*', on_error='raise')"
    assert repr(TarArchiveLoader(source, "r|", 7)) == (
        "TarArchiveLoader(mode='r|', length=7, on_error='raise')"
    )


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


# --- the fast header reader (TarStream) gives what tarfile gives ----------------------------


FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}


def with_tarfile(data):
    """The regular members and hard links as tarfile itself reads them: [(name, bytes)].

    A hard link gets its target's bytes (tarfile's extractfile); KeyError if its target is
    not an earlier member."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar]
    if not any(m.islnk() for m, _ in members):
        return [(m.name, payload) for m, payload in members if m.isfile()]
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:  # links need seeking
        return [(m.name, tar.extractfile(m).read()) for m in tar if m.isfile() or m.islnk()]


def write_entries(entries, fmt, **options):
    """entries: (name, type, data, linkname); what tarfile cannot write in ``fmt`` is left out."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt, **options) as tar:
        for name, kind, data, linkname in entries:
            info = tarfile.TarInfo(name)
            info.type, info.size, info.linkname = kind, len(data), linkname
            try:
                tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
            except ValueError:  # e.g. a name too long for ustar
                continue
    return buffer.getvalue()


def load(data, name="h.tar", **options):
    return list(TarArchiveLoader(IterableWrapper([(name, io.BytesIO(data))]), **options))


def loaded_like_tarfile(data, name="h.tar"):
    return [(f"{name}/{member}", payload) for member, payload in with_tarfile(data)]


name_parts = st.text(st.sampled_from("abcxyz-_.éü日本🙂"), min_size=1, max_size=40)
member_names = st.lists(name_parts, min_size=1, max_size=8).map("/".join)
entries = st.tuples(
    member_names,
    st.sampled_from([tarfile.REGTYPE] * 4 + [tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE]),
    st.integers(0, 2000),
    st.sampled_from(["", "target", "t/" * 70]),
).map(lambda e: (e[0], e[1], b"d" * e[2] if e[1] == tarfile.REGTYPE else b"", e[3]))


@settings(max_examples=150, deadline=None)
@given(st.lists(entries, max_size=8), st.sampled_from(sorted(FORMATS)), st.booleans())
def test_fast_reader_yields_exactly_what_tarfile_yields(members, fmt, global_header):
    options = {"pax_headers": {"comment": "ünïcode"}} if global_header and fmt == "pax" else {}
    data = write_entries(members, FORMATS[fmt], **options)
    if global_header and fmt == "pax" and not members:
        return  # a lone global header: both readers reject it (no member follows)
    try:
        expected = loaded_like_tarfile(data)
    except KeyError:  # a hard link to no earlier member: tarfile cannot extract it either
        with pytest.raises(tarfile.ReadError, match="hard link .* not an earlier regular file"):
            load(data)
        return
    assert load(data) == expected
    assert load(data, mode="r|*") == loaded_like_tarfile(data)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_long_unicode_names_links_and_directories_in_every_format(fmt):
    long = "deep/" * 30 + "ünïcödé-" * 10 + ".jpg"
    members = [
        ("d", tarfile.DIRTYPE, b"", ""),
        ("d/short.cls", tarfile.REGTYPE, b"1", ""),
        ("a" * 99 + ".txt", tarfile.REGTYPE, b"x" * 513, ""),
        ("p/" * 60 + "f.bin", tarfile.REGTYPE, b"", ""),  # ustar: prefix + name
        (long, tarfile.REGTYPE, b"y" * 1024, ""),
        ("link", tarfile.SYMTYPE, b"", "t" * 150),
        ("after.txt", tarfile.REGTYPE, b"z", ""),
    ]
    data = write_entries(members, FORMATS[fmt])
    assert load(data) == loaded_like_tarfile(data)
    if fmt != "ustar":
        assert (f"h.tar/{long}", b"y" * 1024) in load(data)


def test_pax_global_header_path_and_extended_size_are_applied_as_tarfile_does():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.fileobj.write(tarfile.TarInfo.create_pax_global_header({"comment": "c", "path": "g/"}))
        tar.offset += 1024
        info = tarfile.TarInfo("a.bin")
        info.size, info.pax_headers = 3, {"size": "3", "mtime": "1.5"}
        tar.addfile(info, io.BytesIO(b"abc"))
    data = buffer.getvalue()
    assert load(data) == loaded_like_tarfile(data) == [("h.tar/g", b"abc")]


def test_webdataset_tarwriter_style_shards_are_read():
    buffer = io.BytesIO()  # what webdataset.TarWriter writes: pax format, fixed owner/mode
    with tarfile.open(fileobj=buffer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for key in ("sample0", "sample1"):
            for ext, payload in ((".cls", b"3"), (".jpg", b"\xff\xd8" * 300)):
                info = tarfile.TarInfo(key + ext)
                info.size, info.mtime, info.mode = len(payload), 1.7e9 + 0.25, 0o444
                info.uname = info.gname = "bigdata"
                tar.addfile(info, io.BytesIO(payload))
    data = buffer.getvalue()
    assert load(data) == loaded_like_tarfile(data) and len(load(data)) == 4


def sparse_archive():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, payload, pax in [
            ("before.txt", b"b", {}),
            (
                "holes.bin",
                b"abc",
                {
                    "GNU.sparse.size": "10",
                    "GNU.sparse.numblocks": "1",
                    "GNU.sparse.offset": "4",
                    "GNU.sparse.numbytes": "3",
                },
            ),
            ("after.txt", b"a" * 700, {}),
            ("x" * 120, b"long", {}),
        ]:
            info = tarfile.TarInfo(name)
            info.size, info.pax_headers = len(payload), pax
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def test_sparse_members_are_handed_to_tarfile_and_reading_goes_on():
    data = sparse_archive()
    assert load(data) == loaded_like_tarfile(data)
    assert load(data)[1] == ("h.tar/holes.bin", b"\0" * 4 + b"abc" + b"\0" * 3)
    assert collect_resumed(data, 3) == loaded_like_tarfile(data)[3:]


def test_after_a_sparse_member_the_end_is_checked_and_sizes_bounded_too():
    data = sparse_archive()
    with pytest.raises(tarfile.ReadError, match=r"data after the end-of-archive marker.*after 4"):
        load(data + data)
    with pytest.raises(tarfile.ReadError, match=r"'after.txt' claims a size of 700 bytes"):
        load(data, max_member_size=500)
    cut = data[: data.index(b"a" * 700) + 100]
    with pytest.raises(tarfile.ReadError, match=r"h.tar' is corrupted or truncated"):
        load(cut)


def collect_resumed(data, skip):
    loader = TarArchiveLoader(IterableWrapper([("h.tar", io.BytesIO(data))]))
    loader.load_state_dict({"skip": skip})
    return [loader.async_next() for _ in range(len(with_tarfile(data)) - skip)]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_resume_skips_members_behind_long_name_and_pax_headers(fmt):
    members = [
        (f"{'n' * 90}/{i}.bin", tarfile.REGTYPE, bytes([i]) * (i * 300), "") for i in range(5)
    ]
    data = write_entries(members, FORMATS[fmt])
    for skip in range(6):
        assert collect_resumed(data, skip) == loaded_like_tarfile(data)[skip:]


class ReadOnly:
    """Only ``read``, returning at most ``step`` bytes a call: no seek, tell or readinto."""

    def __init__(self, data, step):
        self._inner, self.step, self.closed = io.BytesIO(data), step, False

    def read(self, size=-1):
        return self._inner.read(self.step if size < 0 else min(size, self.step))

    def close(self):
        self.closed = True


@pytest.mark.parametrize("step", [1, 100, 511, 4096])
@pytest.mark.parametrize("mode", ["r|", "r|*"])
def test_reads_a_read_only_stream_with_short_reads(step, mode):
    members = [
        ("x" * 150 + ".bin", tarfile.REGTYPE, b"1" * 3000, ""),
        ("b.cls", tarfile.REGTYPE, b"2", ""),
    ]
    data = write_entries(members, tarfile.PAX_FORMAT)
    stream = ReadOnly(data, step)
    got = list(TarArchiveLoader(IterableWrapper([("u.tar", stream)]), mode=mode))
    assert got == loaded_like_tarfile(data, "u.tar") and stream.closed


def truncation_fixture():
    members = [
        ("a.bin", tarfile.REGTYPE, b"x" * 600, ""),
        ("l" * 120 + ".bin", tarfile.REGTYPE, b"y" * 100, ""),
        ("c.bin", tarfile.REGTYPE, b"", ""),
    ]
    data = write_entries(members, tarfile.GNU_FORMAT)
    return data, _end_of_archive(data)


def _end_of_archive(data):
    """The byte offset where the end-of-archive marker's first block ends."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.getmembers()
        return tar.offset + 512


def test_truncated_at_every_offset_raises_naming_shard_offset_and_count():
    data, complete = truncation_fixture()
    full = loaded_like_tarfile(data, "cut.tar")
    for cut in range(complete):
        with pytest.raises(
            tarfile.ReadError,
            match=(
                r"tar shard 'cut.tar' (is corrupted or truncated|is not a readable tar archive).*"
                r"at byte offset \d+, after \d member\(s\)"
            ),
        ):
            load(data[:cut], "cut.tar")
        kept = load(data[:cut], "cut.tar", on_error="skip")
        assert kept == full[: len(kept)]
    for cut in range(complete, len(data) + 1):
        assert load(data[:cut], "cut.tar") == full


def test_on_error_warn_on_a_truncated_shard_warns_and_keeps_the_complete_members():
    data, _ = truncation_fixture()
    with pytest.warns(UserWarning, match=r"'cut.tar' is corrupted or truncated.*after 1 member"):
        kept = load(data[: 1536 + 100], "cut.tar", on_error="warn")
    assert kept == loaded_like_tarfile(data, "cut.tar")[:1]


@pytest.mark.parametrize(
    "compress,mode",
    [
        (gzip.compress, "r|*"),
        (gzip.compress, "r:gz"),
        (gzip.compress, "r"),
        (bz2.compress, "r|*"),
        (bz2.compress, "r|bz2"),
        (lzma.compress, "r|*"),
        (lzma.compress, "r:xz"),
        (lambda d: d, "r|*"),
        (lambda d: d, "r:*"),
    ],
)
def test_compressed_and_plain_shards_in_every_detecting_mode(compress, mode):
    data = write_entries(
        [("a.txt", tarfile.REGTYPE, b"1" * 900, ""), ("y" * 200, tarfile.REGTYPE, b"2", "")],
        tarfile.GNU_FORMAT,
    )
    assert load(compress(data), mode=mode) == loaded_like_tarfile(data)


def test_compressed_shard_in_plain_mode_says_to_use_r_pipe_star():
    data = gzip.compress(write_entries([("a", tarfile.REGTYPE, b"1", "")], tarfile.GNU_FORMAT))
    hint = r"not a readable tar archive \(if it is compressed, use mode='r\|\*'\)"
    with pytest.raises(tarfile.ReadError, match=hint):
        load(data, mode="r|")


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress, lzma.compress])
def test_the_default_mode_detects_compression_as_tarfile_and_torchdata_do(compress):
    data = write_entries([("a", tarfile.REGTYPE, b"1" * 700, "")], tarfile.GNU_FORMAT)
    assert load(compress(data)) == load(data) == [("h.tar/a", b"1" * 700)]
    pipe = IterableWrapper([("g.tgz", io.BytesIO(compress(data)))]).load_from_tar()
    assert pipe.mode == "r|*" and list(pipe) == [("g.tgz/a", b"1" * 700)]


def test_truncated_compressed_shard_raises():
    data = gzip.compress(
        write_entries([("a", tarfile.REGTYPE, os.urandom(5000), "")], tarfile.GNU_FORMAT)
    )
    with pytest.raises(tarfile.ReadError, match=r"tar shard 'h.tar' .*byte offset \d+"):
        load(data[: len(data) // 2], mode="r|*")


def test_empty_archive_yields_nothing_and_empty_file_is_not_a_tar():
    assert load(write_entries([], tarfile.GNU_FORMAT)) == []
    with pytest.raises(tarfile.ReadError, match=r"not a readable tar archive: empty file"):
        load(b"")


# --- integrity: compressed trailers, lone zero blocks, absurd sizes, stream errors -----------


def three_members():
    return write_entries(
        [(f"m{i}.bin", tarfile.REGTYPE, random.Random(i).randbytes(700), "") for i in range(3)],
        tarfile.GNU_FORMAT,
    )


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress, lzma.compress])
def test_every_single_bit_flip_in_a_compressed_shard_is_harmless_or_raises(compress):
    data = compress(three_members())
    expected = loaded_like_tarfile(three_members())
    rng = random.Random(13)
    for _ in range(60):
        damaged = bytearray(data)
        damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        try:
            got = load(bytes(damaged))
        except tarfile.ReadError as error:
            assert "tar shard 'h.tar'" in str(error) and "byte offset" in str(error)
        else:  # e.g. a flip in gzip's modification time: the members are intact
            assert got == expected


def test_a_flipped_bit_in_gzip_member_data_fails_the_crc_check_at_the_end():
    plain = three_members()
    data = bytearray(gzip.compress(plain, mtime=0))
    stored = gzip.compress(plain, compresslevel=0, mtime=0)  # data stored verbatim: a flip stays
    damaged = bytearray(stored)
    damaged[10 + 5 + 512 + 100] ^= 0x10  # gzip header, stored block header, tar header
    with pytest.raises(tarfile.ReadError, match=r"CRC check failed.*may be damaged"):
        load(bytes(damaged))
    assert load(bytes(data)) == loaded_like_tarfile(plain)


def test_a_compressed_shard_failing_late_warns_even_with_on_error_skip():
    stored = bytearray(gzip.compress(three_members(), compresslevel=0, mtime=0))
    stored[10 + 5 + 512 + 100] ^= 0x10
    with pytest.warns(UserWarning, match=r"3 member\(s\) already read .* may be damaged"):
        assert len(load(bytes(stored), on_error="skip")) == 3


def test_a_lone_zero_block_in_the_middle_raises_instead_of_ending_the_shard():
    data = bytearray(three_members())
    second = 512 + 1024  # header + two data blocks of the first member
    data[second : second + 512] = bytes(512)
    with pytest.raises(tarfile.ReadError, match=r"lone zero block at byte offset 1536.*after 1"):
        load(bytes(data))
    with pytest.warns(UserWarning, match=r"lone zero block at byte offset 1536.*skipping the rest"):
        assert load(bytes(data), on_error="warn") == loaded_like_tarfile(three_members())[:1]
    assert load(bytes(data), on_error="skip") == loaded_like_tarfile(three_members())[:1]


def test_data_after_the_end_of_archive_marker_raises():
    concatenated = three_members() + three_members()  # needs tar --ignore-zeros
    with pytest.raises(tarfile.ReadError, match=r"data after the end-of-archive marker.*after 3"):
        load(concatenated)
    padded = three_members() + bytes(20000)  # zero padding is fine
    assert load(padded) == loaded_like_tarfile(three_members())


def with_size_field(field, name="big.bin", data=b""):
    """A one-member archive whose header's size field is ``field`` (12 bytes), checksum fixed."""
    header = bytearray(tarfile.TarInfo(name).tobuf(tarfile.GNU_FORMAT))
    header[124:136] = field
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header) + data + bytes(-len(data) % 512) + bytes(1024)


def base256(value):
    return (
        (b"\x80" + value.to_bytes(11, "big"))
        if value >= 0
        else b"\xff" + ((256**11 + value).to_bytes(11, "big"))
    )


@pytest.mark.parametrize(
    "field,expected",
    [
        (base256(2**64), r"claims a size of 18446744073709551616 bytes, more than max_member"),
        (base256(2**40), r"claims a size of 1099511627776 bytes"),
        (base256(2**80), r"claims a size of"),
        (base256(-5), r"negative size -5"),
        (b"zzzzzzzzzzz\0", r"invalid member header"),
    ],
)
def test_absurd_member_sizes_raise_a_clear_error_that_on_error_handles(field, expected):
    data = with_size_field(field, data=b"x" * 10)
    with pytest.raises(tarfile.ReadError, match=rf"tar shard 'h.tar' .*{expected}.*byte offset 0"):
        load(data)
    assert load(data, on_error="skip") == []
    with pytest.warns(UserWarning, match=expected):
        assert load(data, on_error="warn") == []


def test_a_size_within_max_member_size_but_past_the_data_is_truncation_read_in_chunks():
    data = with_size_field(b"%011o\0" % (8 * 2**30), data=b"x" * 10)  # 8 GiB, 10 bytes there
    with pytest.raises(tarfile.ReadError, match=r"truncated"):
        load(data, max_member_size=None)
    with pytest.raises(tarfile.ReadError, match=r"more than max_member_size=1000"):
        load(with_size_field(b"%011o\0" % 1001), max_member_size=1000)


def pax_archive(records):
    """A pax 'x' header carrying ``records`` (raw bytes), then one member 'a' of 3 bytes."""
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, len(records)
    member = tarfile.TarInfo("a")
    member.size = 3
    return (
        header.tobuf(tarfile.USTAR_FORMAT)
        + records
        + bytes(-len(records) % 512)
        + member.tobuf(tarfile.USTAR_FORMAT)
        + b"abc"
        + bytes(509 + 1024)
    )


@pytest.mark.parametrize(
    "records",
    [
        b"24 size=1099511627776\n",  # 1 TiB
        b"31 size=18446744073709551616000\n",  # past 2^64
        b"11 size=-5\n",
        b"13 size=12ab\n",
        b"99999999999999999999 path=x\n",  # a record length past the header
        b"5 path=x\n",  # a length that does not end on the newline
        b"garbage without a length\n",
        b"0 path=x\n",
        b"6 =xy\n",  # no keyword
    ],
)
def test_pax_garbage_and_absurd_pax_sizes_raise_a_clear_error(records):
    data = pax_archive(records)
    with pytest.raises(tarfile.ReadError, match=r"tar shard 'h.tar' .*(pax|size|claims).*offset"):
        load(data)
    assert load(data, on_error="skip") == []
    assert load(pax_archive(b"10 path=b\n")) == [("h.tar/b", b"abc")]


def test_an_absurd_long_name_header_size_raises_before_reading():
    header = tarfile.TarInfo("././@LongLink")
    header.type, header.size = tarfile.GNUTYPE_LONGNAME, 2**40
    data = header.tobuf(tarfile.GNU_FORMAT) + bytes(2048)
    with pytest.raises(tarfile.ReadError, match=r"header of 1099511627776 bytes"):
        load(data)


class FailingStream(io.RawIOBase):
    """Fails with ``error`` once ``after`` bytes have been read (a disk or network error)."""

    def __init__(self, data, after, error):
        self._inner, self.after, self.error = io.BytesIO(data), after, error

    def readable(self):
        return True

    def readinto(self, buffer):
        if self._inner.tell() >= self.after:
            raise self.error
        return self._inner.readinto(memoryview(buffer)[: self.after - self._inner.tell()])


@pytest.mark.parametrize("on_error", ["raise", "warn", "skip"])
@pytest.mark.parametrize("compress", [None, gzip.compress])
def test_an_error_of_the_stream_itself_is_raised_whatever_on_error_says(on_error, compress):
    data = three_members() if compress is None else compress(three_members())
    error = TimeoutError("GET http://host/s.tar: no data for 30 s")
    stream = FailingStream(data, len(data) // 2, error)
    loader = TarArchiveLoader(IterableWrapper([("s.tar", stream)]), on_error=on_error)
    with pytest.raises(TimeoutError, match=r"GET http://host/s.tar: no data for 30 s"):
        list(loader)


def test_length_is_torchdatas_nominal_length():
    source = IterableWrapper([])
    assert len(IterableWrapper([]).load_from_tar(length=12)) == 12
    with pytest.raises(TypeError, match=r"no length: pass length="):
        len(TarArchiveLoader(source))


def hard_linked(fmt=tarfile.GNU_FORMAT, sparse_first=False):
    """GNU tar over hard-linked files: the first name holds the data, the others are links."""
    long = "d/" * 60 + "0002.jpg"  # a long link target: GNU 'K' or pax linkpath
    members = [
        ("./0000.jpg", tarfile.REGTYPE, b"J" * 700, ""),
        ("./0000.cls", tarfile.REGTYPE, b"1", ""),
        ("./0001.jpg", tarfile.LNKTYPE, b"", "./0000.jpg"),  # dedup tools hard-linked it
        ("./0001.cls", tarfile.LNKTYPE, b"", "0000.cls"),  # tarfile matches normalized names
        (long, tarfile.REGTYPE, b"K" * 3, ""),
        ("0002.jpg", tarfile.LNKTYPE, b"", long),
        ("0002.cls", tarfile.LNKTYPE, b"", "./0001.cls"),  # a link to a link
    ]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        if sparse_first:  # from here on the archive is read by tarfile
            info = tarfile.TarInfo("holes.bin")
            info.size = 3
            info.pax_headers = {
                "GNU.sparse.size": "5",
                "GNU.sparse.numblocks": "1",
                "GNU.sparse.offset": "2",
                "GNU.sparse.numbytes": "3",
            }
            tar.addfile(info, io.BytesIO(b"abc"))
        for name, kind, payload, linkname in members:
            info = tarfile.TarInfo(name)
            info.type, info.size, info.linkname = kind, len(payload), linkname
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


@pytest.mark.parametrize(("fmt", "sparse_first"), [("gnu", False), ("pax", False), ("pax", True)])
def test_hard_links_yield_their_targets_bytes_from_a_seekable_shard(tmp_path, fmt, sparse_first):
    data = hard_linked(FORMATS[fmt], sparse_first)
    expected = loaded_like_tarfile(data)
    assert ("h.tar/0002.cls", b"1") in expected and len(expected) == 7 + sparse_first
    assert load(data) == expected  # once these links were dropped: samples silently lost
    (tmp_path / "h.tar").write_bytes(data)
    files = FileLister(tmp_path, "*.tar").open_files("rb")
    pipe = files.load_from_tar()
    assert [(p.member, payload) for p, payload in collect(pipe)] == with_tarfile(data)
    samples = collect(FileLister(tmp_path, "*.tar").open_files("rb").load_from_tar().webdataset())
    by_key = {s["__key__"]: (s.get("jpg", b"")[:1], s.get("cls")) for s in samples}
    assert [by_key[key] for key in ("./0000", "./0001", "0002")] == [(b"J", b"1")] * 2 + [
        (b"K", b"1")
    ]
    check_resume_from_every_step(
        lambda: FileLister(tmp_path, "*.tar").open_files("rb").load_from_tar()
    )


@pytest.mark.parametrize("compress", [None, gzip.compress])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_hard_link_in_a_stream_that_cannot_seek_back_raises_saying_how_to_fix_it(
    compress, on_error
):
    data = hard_linked()
    data = compress(data) if compress else data
    pipe = IterableWrapper([("http.tar", Unseekable(data))]).load_from_tar(on_error=on_error)
    got = []
    with pytest.raises(
        tarfile.StreamError,
        match=r"'http.tar'.*'./0001.jpg' is a hard link.*"
        r"--hard-dereference",
    ):
        got.extend(pipe)
    assert [p.member for p, _ in got] == ["./0000.jpg", "./0000.cls"]


def test_a_hard_link_to_no_earlier_member_is_damage_that_on_error_handles():
    data = write_entries(
        [("a", tarfile.LNKTYPE, b"", "b"), ("b", tarfile.REGTYPE, b"x", "")], tarfile.GNU_FORMAT
    )
    with pytest.raises(
        tarfile.ReadError, match=r"'a' is a hard link to 'b', which is not an earlier"
    ):
        load(data)
    assert load(data, on_error="skip") == []
