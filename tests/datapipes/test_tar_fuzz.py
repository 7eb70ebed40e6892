"""Fuzzing the tar reader: damaged shards give the right members or a named error, never less.

Each case takes a well-formed archive (ustar, GNU or pax; plain, gz, bz2 or
xz), damages it (bit flips, a truncation, a zeroed block, an absurd size, pax
garbage; or flips and cuts in the compressed bytes), reads it with one
``on_error`` policy, and checks what came out against what the damage allows:

* no error: every member, each exactly as the damaged bytes hold it (a tar
  has no checksum over member data or pax records, so a flip there changes
  that member, but no member may go missing);
* an error: ``tarfile.ReadError`` naming the shard and a byte offset (or one
  warning with ``on_error="warn"``), the members before it as above; damage
  that every reader can see (a header, the end-of-archive marker, a
  truncation, any damage of compressed bytes) must give one, except a change
  of a header's checksum field that leaves it holding the header's sum
  (``checksum_holds``: a leading "0" made a space, say), which changes nothing;
* never another exception (no bare ``OverflowError``/``MemoryError``), a
  Python heap bounded by the shard's size, and reads bounded by its length.

Cases are drawn from a seeded generator, so a failure names its seed;
``check_case(seed)`` replays it. ``pytest --runslow`` adds thousands more.
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import io
import lzma
import random
import re
import tarfile
import tracemalloc
import warnings
from typing import Any

import pytest

from pipeloom.datapipes import IterableWrapper, TarArchiveLoader

SHARD = "fuzz.tar"
COMPRESSORS = {
    "none": lambda data: data,
    "gz": lambda data: gzip.compress(data, mtime=0),
    "bz2": bz2.compress,
    "xz": lzma.compress,
}
FORMATS = (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT)


@dataclasses.dataclass(frozen=True)
class Entry:
    """Where one archive entry lies: [start, header) preamble, header block, data."""

    name: str
    regular: bool
    start: int  # first block of the entry (its long-name/pax preamble, if any)
    data: int  # first byte of its data (its own header is the block before)
    size: int


@dataclasses.dataclass(frozen=True)
class Base:
    data: bytes
    entries: tuple[Entry, ...]
    end: int  # where the end-of-archive marker starts

    def members(self, damaged: bytes) -> list[tuple[str, bytes]]:
        return [(e.name, damaged[e.data : e.data + e.size]) for e in self.entries if e.regular]


def make_base(seed: int) -> Base:
    rng = random.Random(seed)
    fmt = FORMATS[seed % 3]
    options = {"pax_headers": {"comment": "fuzz"}} if fmt == tarfile.PAX_FORMAT and seed % 2 else {}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt, **options) as tar:
        for i in range(rng.randint(1, 5)):
            kind = rng.choices(["file", "dir", "symlink"], [8, 1, 1])[0]
            stem = rng.choice([f"d/m{i}", "x" * rng.randint(95, 160) + str(i), f"ü/日{i}"])
            info = tarfile.TarInfo(f"{stem}.bin")
            data = rng.randbytes(rng.choice([1, rng.randint(1, 700), rng.randint(700, 3000)]))
            if kind == "file":
                info.size = len(data)
            else:
                info.type = tarfile.DIRTYPE if kind == "dir" else tarfile.SYMTYPE
                info.linkname = "target" * rng.randint(1, 30) if kind == "symlink" else ""
                data = b""
            try:
                tar.addfile(info, io.BytesIO(data) if data else None)
            except ValueError:  # a name or link this format cannot hold
                continue
        if not tar.getmembers():
            info = tarfile.TarInfo("last.bin")
            info.size = 100
            tar.addfile(info, io.BytesIO(rng.randbytes(100)))
    raw = buffer.getvalue()
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        entries = tuple(
            Entry(m.name, m.isfile(), m.offset, m.offset_data, m.size if m.isfile() else 0)
            for m in tar.getmembers()
        )
        end = tar.offset
    return Base(raw, entries, end)


BASES = [make_base(seed) for seed in range(30)]


@dataclasses.dataclass
class Damage:
    """The damaged shard and what the damage allows."""

    shard: bytes
    plain: bytes | None  # the damaged uncompressed tar, when the damage was done there
    must_fail: bool  # every reader can see it: an error (or warning) is required
    renamed: frozenset[int]  # entries whose preamble (long name, pax records) changed
    description: str


ANY_MEMBERS: frozenset[int] = frozenset({-1})  # damage that may change members undetectably


def preamble_touched(base: Base, positions: list[int]) -> frozenset[int]:
    return frozenset(
        i
        for i, e in enumerate(base.entries)
        if any(e.start + 512 <= p < e.data - 512 for p in positions)
    )


def checksum_holds(header: bytes) -> bool:
    """The header's checksum field still holds the header's sum.

    The field is read as GNU tar reads it: octal digits after any spaces, then
    a NUL, a space or the field's end (what follows is ignored). The sum counts
    the field as eight spaces and is taken over unsigned or signed bytes (both
    are accepted). So ``"012345\\0 "`` may become ``" 12345\\0 "``, ``"012345  "``
    or ``"012345\\0x"``, or a digit may change to give the signed sum of a header
    with bytes over 127: a changed byte no reader can see.
    """
    match = re.match(rb" *([0-7]+)(?:[ \0]|\Z)", header[148:156])
    blanked = header[:148] + b" " * 8 + header[156:]
    sums = (sum(blanked), sum(b - 256 if b > 127 else b for b in blanked))
    return match is not None and int(match.group(1), 8) in sums


def in_checked_block(base: Base, damaged: bytes, position: int) -> bool:
    """A header block, or the end-of-archive marker and padding: a change there is visible.

    Except a change of a header's checksum field that keeps it holding the sum.
    """
    if position >= base.end:
        return True
    header = header_at(base, position)
    return header is not None and not checksum_holds(damaged[header : header + 512])


def header_at(base: Base, position: int) -> int | None:
    """Where the header block holding ``position`` starts (None: not in a header)."""
    for e in base.entries:
        for header in (e.start, e.data - 512):
            if header <= position < header + 512:
                return header
    return None


def damage_plain(rng: random.Random, base: Base) -> tuple[bytes, bool, Any, str]:
    data = bytearray(base.data)
    kind = rng.choice(["flip", "flips", "truncate", "zero_block", "huge_size", "pax_garbage"])
    if kind == "pax_garbage":
        with_preamble = [e for e in base.entries if e.data - e.start > 512]
        if not with_preamble:
            kind = "huge_size"
        else:
            entry = rng.choice(with_preamble)
            at = rng.randrange(entry.start + 512, entry.data - 512)
            garbage = rng.choice(
                [
                    rng.randbytes(rng.randint(1, 40)),
                    b"99999999999999999999 path=x\n",
                    b"24 size=1099511627776\n",
                    b"0 path=",
                ]
            )
            garbage = garbage[: entry.data - 512 - at]
            data[at : at + len(garbage)] = garbage
            return bytes(data), False, list(range(at, at + len(garbage))), f"pax garbage at {at}"
    if kind == "huge_size":
        entry = rng.choice([e for e in base.entries if e.regular] or list(base.entries))
        header = entry.data - 512 if entry.regular else entry.start
        field = rng.choice(
            [
                b"\x80" + (2**64).to_bytes(11, "big"),
                b"\x80" + (2**40).to_bytes(11, "big"),
                b"77777777777\0",
                b"\xff" * 12,  # -1 in base-256
                b"zz" + b"7" * 9 + b"\0",
            ]
        )
        data[header + 124 : header + 136] = field
        data[header + 148 : header + 156] = b" " * 8
        data[header + 148 : header + 156] = b"%06o\0 " % sum(data[header : header + 512])
        must = entry.regular or header != entry.data - 512
        return bytes(data), must, [], f"size field {field!r} at {header}"
    if kind == "truncate":
        cut = rng.randrange(len(data))
        return bytes(data[:cut]), cut < base.end + 512, [], f"cut at {cut}"
    if kind == "zero_block":
        block = rng.randrange(len(data) // 512) * 512
        data[block : block + 512] = bytes(512)
        changed = [p for p in range(block, block + 512) if base.data[p]]
        header = any(block in (e.start, e.data - 512) for e in base.entries)
        followed = any(base.data[block + 512 : block + 1024])  # else it reads as the end
        return bytes(data), header and followed, changed, f"zeroed block at {block}"
    positions = [rng.randrange(len(data)) for _ in range(1 if kind == "flip" else 3)]
    for p in positions:
        data[p] ^= 1 << rng.randrange(8)
    changed = [p for p in set(positions) if data[p] != base.data[p]]
    must = kind == "flip" and in_checked_block(base, bytes(data), positions[0])
    blocks = [p // 512 for p in changed if p >= base.end or header_at(base, p) is not None]
    if len(blocks) != len(set(blocks)):  # two flips in one header can cancel in its sum
        return bytes(data), False, ANY_MEMBERS, f"flipped bits at {positions} (one header)"
    return bytes(data), must, changed, f"flipped bits at {positions}"


def make_damage(seed: int) -> tuple[Base, str, Damage]:
    rng = random.Random(seed)
    base = rng.choice(BASES)
    compression = rng.choice(list(COMPRESSORS))
    compress = COMPRESSORS[compression]
    if compression != "none" and rng.random() < 0.5:  # damage the compressed bytes
        shard = bytearray(compress(base.data))
        if rng.random() < 0.5:
            cut = rng.randrange(len(shard))
            return (
                base,
                compression,
                Damage(bytes(shard[:cut]), None, True, frozenset(), f"cut {cut}"),
            )
        positions = [rng.randrange(len(shard)) for _ in range(rng.randint(1, 3))]
        for p in positions:
            shard[p] ^= 1 << rng.randrange(8)
        return (
            base,
            compression,
            Damage(bytes(shard), None, False, frozenset(), f"flip {positions}"),
        )
    plain, must_fail, changed, description = damage_plain(rng, base)
    renamed = ANY_MEMBERS if changed is ANY_MEMBERS else preamble_touched(base, changed)
    return base, compression, Damage(compress(plain), plain, must_fail, renamed, description)


class CountingStream:
    """A read-only stream that counts its reads (so reading is bounded by the data)."""

    def __init__(self, data: bytes) -> None:
        self._inner = io.BytesIO(data)
        self.reads = 0
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        self.reads += 1
        return self._inner.read(size)

    def close(self) -> None:
        self.closed = True


def read_shard(shard: bytes, on_error: str):
    """(members, error, warnings, reads, peak heap bytes) of reading ``shard`` once."""
    stream = CountingStream(shard)
    loader = TarArchiveLoader(IterableWrapper([(SHARD, stream)]), on_error=on_error)
    got: list[tuple[str, bytes]] = []
    error = None
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for path, data in loader:
                got.append((path.member, data))
        except tarfile.ReadError as raised:
            error = raised
    peak = tracemalloc.get_traced_memory()[1] - before
    return got, error, [str(w.message) for w in caught], stream.reads, peak


def fits(got, expected, renamed_entries, base: Base) -> bool:
    """Each member read is the one the damaged bytes hold (names free where a preamble changed)."""
    regular = [i for i, e in enumerate(base.entries) if e.regular]
    if len(got) > len(expected):
        return False
    for (name, data), (want_name, want_data), index in zip(got, expected, regular):
        if data != want_data or (name != want_name and index not in renamed_entries):
            return False
    return True


NAMED = rf"tar shard '{SHARD}' .*at byte offset \d+"


def check_case(seed: int) -> None:
    base, compression, damage = make_damage(seed)
    on_error = ("raise", "warn", "skip")[seed % 3]
    check_damage(base, compression, damage, on_error, f"case {seed}")


def check_damage(base: Base, compression: str, damage: Damage, on_error: str, case: str) -> None:
    """What reading ``damage.shard`` with ``on_error`` gives is what the damage allows."""
    got, error, messages, reads, peak = read_shard(damage.shard, on_error)
    where = f"{case}: {compression} shard, {damage.description}, on_error={on_error!r}"
    assert reads <= len(damage.shard) + 8, f"{where}: {reads} reads"
    allowance = 12 << 20 if compression == "xz" else 1 << 20  # xz's 8 MiB dictionary
    assert peak < 16 * len(base.data) + allowance, f"{where}: peak heap {peak} bytes"
    reported = [str(error)] if error is not None else messages
    assert len(reported) <= 1, f"{where}: {reported}"
    for message in reported:
        assert re.search(NAMED, message, re.DOTALL), f"{where}: unnamed {message!r}"
    if on_error != "raise":
        assert error is None, f"{where}: raised {error}"
    if on_error != "warn" and compression == "none":
        assert not messages, f"{where}: warned {messages}"
    original = base.members(base.data)
    if damage.plain is None:  # damaged compressed bytes: members exact, or a report
        if not reported:
            if on_error == "skip":
                assert got == original[: len(got)], f"{where}: silent damage {got}"
            else:
                assert got == original and not damage.must_fail, f"{where}: got {got}"
        if "cut" in damage.description:
            assert got == original[: len(got)], f"{where}: a cut changed members"
        return
    if damage.renamed is ANY_MEMBERS:
        return  # a tar header's checksum is a sum: this damage can be invisible
    expected = base.members(damage.plain)
    assert fits(got, expected, damage.renamed, base), f"{where}: got {got}, want {expected}"
    if on_error == "skip" and not reported:
        return  # the rest of a damaged shard may be skipped silently: the user asked for it
    if not reported:
        assert len(got) == len(expected) and not damage.must_fail, f"{where}: silent loss"


@pytest.fixture(scope="module", autouse=True)
def traced_heap():
    tracemalloc.start()
    yield
    tracemalloc.stop()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("block", range(4))
def test_damaged_shards_give_the_right_members_or_a_named_error(block):
    for seed in range(block * 75, (block + 1) * 75):  # 300 cases in all
        check_case(seed)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", range(10))
def test_damaged_shards_many_more_cases(block):
    for seed in range(1000 + block * 300, 1000 + (block + 1) * 300):  # 3,000 cases
        check_case(seed)


@pytest.mark.parametrize("base", range(3))
def test_a_changed_checksum_byte_is_judged_by_what_readers_see(base):
    """Each byte of each header's checksum field, changed as rare draws change it.

    A change that keeps the field holding the sum (a leading "0" to a space, the
    NUL to a space, anything after the NUL) changes nothing, and must not be
    taken for damage that every reader sees; any other change must raise.
    """
    entries = BASES[base].entries
    for header in sorted({h for e in entries for h in (e.start, e.data - 512)}):
        for at in range(header + 148, header + 156):
            for xor in (0x10, 0x20, 0x5F, 0x1B, 0x39, 0x6F, 0x01, 0x80):
                data = bytearray(BASES[base].data)
                data[at] ^= xor
                damage = Damage(
                    bytes(data),
                    bytes(data),
                    in_checked_block(BASES[base], bytes(data), at),
                    frozenset(),
                    f"xor {xor:#04x} at {at}",
                )
                check_damage(BASES[base], "none", damage, "raise", f"base {base}")


def test_the_fuzzer_damages_in_every_way_and_sees_every_outcome():
    kinds, outcomes = set(), set()
    for seed in range(300):
        base, compression, damage = make_damage(seed)
        kinds.add((compression, damage.description.split(" ")[0]))
        got, error, messages, _, _ = read_shard(damage.shard, "raise")
        outcomes.add("error" if error else "same" if got == base.members(base.data) else "other")
    assert {c for c, _ in kinds} == set(COMPRESSORS)
    assert {k for _, k in kinds} >= {"flipped", "cut", "zeroed", "size", "pax", "flip"}
    assert outcomes == {"error", "same", "other"}
