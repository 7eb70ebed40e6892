"""A fast forward-only reader of tar archives, used by ``load_from_tar``.

``tarfile`` builds a ``TarInfo`` with a dozen parsed fields for every member
(~10 µs each); a shard of small files spends most of its time there. This
reader parses only what a data loader needs (name, size, type) from each
512-byte header, checks the header checksum, and reads each payload with one
``read(size)``. It never seeks (but to read a hard link's target again, see
``_tarlinks.py``), so non-seekable streams (HTTP) work.

It gives the same members as ``tarfile`` for ustar, GNU (``L``/``K`` long
names) and pax (``x``/``g`` headers) archives, e.g. those written by
``tarfile`` in any format or by ``webdataset.TarWriter``, except that, as GNU
tar does, it reads a name prefix only from POSIX ustar headers (see ``_USTAR``). Anything rarer
(sparse files) is handed to ``tarfile`` from that member on.

It is strict where ``tarfile`` is lenient, so that damage is never a silent
end: a missing end-of-archive marker is truncation; a lone zero block followed
by more data (a zeroed header: GNU tar warns "A lone zero block") and data
after the end-of-archive marker are errors, so the rest of the stream is read
and must be zeros (which also lets a decompressor check its trailer); sizes
are bounded before anything is read (``max_member_size`` for members, 16 MiB
for long-name and pax headers), pax records must be well formed, and a
header's checksum field is read as GNU tar reads it (octal digits after any
spaces, then a NUL or a space), not with ``int``'s leniency ("+", "_", "0o").

Example:
    >>> import io, tarfile
    >>> buffer = io.BytesIO()
    >>> with tarfile.open(fileobj=buffer, mode="w") as tar:
    ...     info = tarfile.TarInfo("a/" + "x" * 120 + ".txt"); info.size = 2
    ...     tar.addfile(info, io.BytesIO(b"hi"))
    >>> [(len(name), data) for name, data in TarStream(io.BytesIO(buffer.getvalue())).members()]
    [(126, b'hi')]
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterator
from typing import IO, Any
from zlib import adler32

from ._tarlinks import HardLinks

__all__ = ["ChainedReader", "StrictTarInfo", "TarStream"]

_BLOCK = 512
_ZERO = bytes(_BLOCK)
_ENCODING = tarfile.ENCODING
_REGULAR = frozenset(tarfile.REGULAR_TYPES) - {tarfile.GNUTYPE_SPARSE}
_NO_DATA = frozenset(tarfile.SUPPORTED_TYPES) - frozenset(tarfile.REGULAR_TYPES)  # links, dirs
_PREAMBLE = frozenset(
    (
        tarfile.GNUTYPE_LONGNAME,
        tarfile.GNUTYPE_LONGLINK,
        tarfile.XHDTYPE,
        tarfile.XGLTYPE,
        tarfile.SOLARIS_XHDTYPE,
    )
)
# A header checksum as GNU tar reads it: octal digits after any spaces, ended by a NUL, a
# space or the field's end. Not int()'s leniency ("+", "_", "0o", tabs), which let more
# changed bytes pass unseen (the checksum field is the one part of a header its sum skips).
_CHECKSUM = re.compile(rb" *([0-7]+)(?:[ \0]|\Z)")
_PAX_LENGTH = re.compile(rb"(\d{1,19}) ")
_PAX_CHARSET = re.compile(rb"\d+ hdrcharset=([^\n]+)\n")
_TRUNCATED = "unexpected end of data (truncated: no end-of-archive marker)"
# The magic of POSIX ustar headers, the only ones with a name prefix (at byte 345). Old GNU
# headers ("ustar  \0") keep access and change times there (tar -g/-G writes them), which
# tarfile takes for a prefix of the name; GNU tar does not.
_USTAR = b"ustar\0"
_GNU_LONG = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
_CHUNK = 1 << 24  # larger reads are split, so a corrupted size never allocates at once
_MAX_HEADER_DATA = 1 << 24  # long names and pax headers: a larger one is corruption


class StrictTarInfo(tarfile.TarInfo):
    """Treats a truncated or invalid header as an error, not as the end of the archive, and
    reads a name prefix only in POSIX ustar headers (see ``_USTAR``)."""

    @classmethod
    def frombuf(cls, buf: bytes, encoding: str, errors: str) -> tarfile.TarInfo:  # type: ignore[override]
        info = super().frombuf(buf, encoding, errors)
        if buf[345] and info.type not in tarfile.GNU_TYPES and buf[257:263] != _USTAR:
            prefix = tarfile.nts(buf[345:500], encoding, errors)  # type: ignore[attr-defined]
            info.name = info.name.removeprefix(prefix + "/")  # not a prefix: see _USTAR
        return info

    @classmethod
    def fromtarfile(cls, tar: tarfile.TarFile) -> tarfile.TarInfo:  # type: ignore[override]
        try:
            return super().fromtarfile(tar)
        except tarfile.EOFHeaderError:  # type: ignore[attr-defined]
            raise  # the end-of-archive marker: a complete archive
        except (tarfile.EmptyHeaderError, tarfile.TruncatedHeaderError):  # type: ignore[attr-defined]
            raise tarfile.ReadError(_TRUNCATED) from None
        except tarfile.InvalidHeaderError as error:  # type: ignore[attr-defined]
            raise tarfile.ReadError(f"invalid member header ({error})") from None


def _text(field: bytes) -> str:
    """``tarfile.nts``: up to the first NUL, decoded as ``tarfile`` decodes names."""
    end = field.find(0)
    return (field if end < 0 else field[:end]).decode(_ENCODING, "surrogateescape")


def _number(field: bytes) -> int:
    """``tarfile.nti``: an octal (or base-256) number field."""
    if field[0] in (0o200, 0o377):
        value = int.from_bytes(field[1:], "big")
        return value - 256 ** (len(field) - 1) if field[0] == 0o377 else value
    end = field.find(0)
    try:
        return int((field if end < 0 else field[:end]).strip() or b"0", 8)
    except ValueError:
        raise tarfile.ReadError("invalid member header (invalid header)") from None


def _pax_field(value: bytes, encoding: str, fallback: str = "utf-8") -> str:
    try:
        return value.decode(encoding, "strict")
    except UnicodeDecodeError:
        return value.decode(fallback, "surrogateescape")


def _pax_records(buf: bytes, into: dict[str, str]) -> None:
    """Parse pax records ``"%d %s=%s\\n"`` into ``into``, as ``tarfile`` does.

    Stricter than ``tarfile``: the records must tile ``buf`` exactly (trailing
    NULs aside), each with a length that ends on its newline.
    """
    match = _PAX_CHARSET.search(buf)
    if match is not None:
        into["hdrcharset"] = match.group(1).decode("utf-8", "surrogateescape")
    encoding = _ENCODING if into.get("hdrcharset") == "BINARY" else "utf-8"
    position, end = 0, len(buf.rstrip(b"\0"))
    while position < end:
        match = _PAX_LENGTH.match(buf, position)
        length = int(match.group(1)) if match is not None else 0
        record = buf[match.end() if match is not None else position : position + length]
        keyword, equals, value = record[:-1].partition(b"=")
        if position + length > len(buf) or not record.endswith(b"\n") or not (keyword and equals):
            raise tarfile.ReadError(
                f"invalid member header (malformed pax record at byte {position} of the "
                f"extended header: {bytes(buf[position : position + 40])!r})"
            )
        name = _pax_field(keyword, "utf-8")
        if name in tarfile.PAX_NAME_FIELDS:
            into[name] = _pax_field(value, encoding, _ENCODING)
        else:
            into[name] = _pax_field(value, "utf-8")
        position += length


def _pax_size(value: str) -> int:
    if not (value.isascii() and value.isdigit() and len(value) <= 20):
        raise tarfile.ReadError(f"invalid member header (pax size {value[:40]!r})")
    return int(value)


def _exotic(pax: dict[str, str]) -> bool:  # GNU sparse files: left to tarfile
    return any(key.startswith("GNU.sparse.") for key in pax)


class TarStream:
    """The regular-file members of one uncompressed tar stream, read front to back.

    Args:
        stream: a binary file object; only ``read`` is used.
        head: bytes already read from the start of ``stream`` (at most one block).
        max_member_size: the largest member size accepted, in bytes (None: no
            limit); a header claiming more is taken as corrupted.
        seekable: whether ``stream`` may be seeked back to read the data of a
            hard link's target (None: ask ``stream.seekable()``).

    A hard link (type ``1``, as GNU tar stores the second name of a file) comes
    out with its target's bytes, as ``tarfile.extractfile`` gives them: the
    target must be an earlier member, read again by seeking back; a stream that
    cannot seek raises ``HardLinkError`` (``_tarlinks.py``). Symbolic links are skipped.

    Attributes ``offset`` (where the block being read starts), ``count``
    (regular members read completely) and ``started`` (a valid header was
    read) describe where a ``tarfile.ReadError`` happened.
    """

    def __init__(
        self,
        stream: IO[bytes],
        head: bytes = b"",
        max_member_size: int | None = None,
        seekable: bool | None = None,
    ) -> None:
        self._read = stream.read
        self._head = head
        self._limit = max_member_size
        self.offset = 0
        self.count = 0
        self.started = False
        self._globals: dict[str, str] = {}  # pax 'g' records, applied to every member
        self._links = HardLinks(stream, seekable)
        self._link: str | None = None  # the target of the hard link ``_entry`` just read

    def _exact(self, size: int, buf: bytes = b"") -> bytes:
        """``size`` bytes (``buf`` is what a first read gave); ReadError at the end of data."""
        parts, got = [buf], len(buf)
        while got < size:
            more = self._read(min(size - got, _CHUNK))
            if not more:
                raise tarfile.ReadError(_TRUNCATED if got or self.started else "empty file")
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def members(self, skip: int = 0) -> Iterator[tuple[str, bytes]]:
        """Yield ``(name, data)`` per regular file, after the first ``skip`` of them."""
        read, limit, targets = self._read, self._limit, self._links.targets
        header, self._head = self._head, b""
        header = header if len(header) == _BLOCK else self._exact(_BLOCK, header)
        while header != _ZERO:  # else the end-of-archive marker
            name, size, flag = self._header(header)
            if flag == tarfile.REGTYPE and not header[345] and not self._globals:
                self.offset += _BLOCK  # the common case: a plain ustar/GNU/pax file
                regular: bool | None = True
            else:
                regular, name, size, raw = self._entry(header, name, size, flag)
                if regular is None:
                    yield from self._with_tarfile(raw, skip)
                    return
            if regular:
                if limit is not None and size > limit:
                    self._too_large(name, size, self.offset - _BLOCK)
                targets[name] = (self.offset, size)
                data = read(size) if size <= _CHUNK else b""
                if len(data) != size:
                    data = self._exact(size, data)
                self.offset += size
                self.count += 1
                if self.count > skip:
                    yield name, data
            elif self._link is not None:
                data = self._links.read(name, self._link, self.offset)
                self.count += 1
                if self.count > skip:
                    yield name, data
            elif size:
                self._discard(size)
            pad = -size % _BLOCK
            self.offset += pad
            want = pad + _BLOCK
            header = read(want)
            if len(header) != want:
                header = self._exact(want, header)
            if pad:
                header = header[pad:]
        self._after_end(self._read)

    def _too_large(self, name: str, size: int, header_at: int) -> None:
        self.offset = header_at
        raise tarfile.ReadError(
            f"invalid member header (member {name[:200]!r} claims a size of {size} bytes, "
            f"more than max_member_size={self._limit}; if the member is really that "
            f"large, pass a larger max_member_size)"
        )

    def _after_end(self, read: Any) -> None:
        """Read past the first zero block at ``offset``: only zeros may follow.

        The second zero block and the record padding are zeros; anything else
        means a member header was zeroed ("a lone zero block") or more data
        follows the archive. Reading to the end also lets a decompressor
        below check its trailer (gzip's CRC-32 and length).
        """
        marker = self.offset
        self.offset += _BLOCK
        while chunk := read(1 << 16):
            rest = chunk.lstrip(b"\0")
            if rest:
                self.offset += len(chunk) - len(rest)
                if self.offset < marker + 2 * _BLOCK:
                    raise tarfile.ReadError(
                        f"a lone zero block at byte offset {marker} is followed by more data "
                        f"(a member header was zeroed: the rest of the shard cannot be read)"
                    )
                raise tarfile.ReadError(
                    f"data after the end-of-archive marker at byte offset {marker} (several "
                    f"archives concatenated, or trailing garbage: rewrite the shard)"
                )
            self.offset += len(chunk)

    def _discard(self, size: int) -> None:
        while size > 0:
            chunk = min(size, 1 << 20)
            self._exact(chunk)
            self.offset += chunk
            size -= chunk

    def _header(self, header: bytes) -> tuple[str, int, bytes]:
        """Name, size and type flag of one (non-zero) header, checksum verified."""
        checksum = _CHECKSUM.match(header, 148, 156)
        if checksum is None:
            raise tarfile.ReadError(
                f"invalid member header (checksum field {header[148:156]!r}: expected octal "
                f"digits after any spaces, then a NUL or a space)"
            )
        stored = int(checksum.group(1), 8)
        try:  # the field as tarfile writes it ("%011o\0"), else in general
            size = int(header[124:135], 8) if header[135] == 0 else _number(header[124:136])
        except ValueError:
            size = _number(header[124:136])
        unsigned = (adler32(header[:256]) & 0xFFFF) + (adler32(header[256:]) & 0xFFFF) + 254
        if stored != unsigned - sum(header[148:156]) and stored not in tarfile.calc_chksums(header):  # type: ignore[attr-defined]
            raise tarfile.ReadError("invalid member header (bad checksum)")
        if size < 0:
            raise tarfile.ReadError(f"invalid member header (negative size {size})")
        self.started = True
        end = header.find(0, 0, 100)
        name = header[: end if end >= 0 else 100].decode(_ENCODING, "surrogateescape")
        return name, size, header[156:157]

    def _entry(
        self, header: bytes, name: str, size: int, flag: bytes
    ) -> tuple[bool | None, str, int, list[bytes]]:
        """(is a regular file, name, data size, raw blocks) of the member at ``header``.

        Reads the ``L``/``K``/``x``/``g`` preamble blocks first, if any, and
        leaves ``offset`` at the member's data. ``None`` means "too rare for
        this reader, let tarfile read it from the raw blocks on".
        """
        self._link = None
        raw: list[bytes] = []
        patches: list[tuple[bytes, Any]] = []  # long names and pax records, in order
        globals_before = self._globals
        while flag in _PREAMBLE:
            if not raw:
                globals_before = dict(self._globals)
            if size > _MAX_HEADER_DATA:
                raise tarfile.ReadError(
                    f"invalid member header (a {flag.decode('ascii', 'replace')!r} header of "
                    f"{size} bytes; more than {_MAX_HEADER_DATA} is taken as corruption)"
                )
            data = self._exact(-size % _BLOCK + size) if size else b""
            self.offset += _BLOCK + len(data)
            raw += (header, data)
            if flag in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
                patches.append((flag, _text(data)))
            elif flag == tarfile.XGLTYPE:
                _pax_records(data[:size], self._globals)
            else:  # an extended header, x or X
                pax = dict(self._globals)
                _pax_records(data[:size], pax)
                patches.append((flag, pax))
            header = self._exact(_BLOCK)
            if header == _ZERO:
                raise tarfile.ReadError("missing or bad subsequent header (end of file header)")
            name, size, flag = self._header(header)
        raw.append(header)
        self.offset += _BLOCK
        if (
            flag == tarfile.GNUTYPE_SPARSE
            or _exotic(self._globals)
            or "size" in self._globals
            or any(kind not in _GNU_LONG and _exotic(p) for kind, p in patches)
        ):
            self.offset -= sum(map(len, raw))
            self._globals = globals_before
            return None, name, size, raw
        return (*self._finish(header, name, size, flag, patches), raw)

    def _finish(
        self, header: bytes, name: str, size: int, flag: bytes, patches: list[tuple[bytes, Any]]
    ) -> tuple[bool, str, int]:
        """Apply ``tarfile``'s rules: prefix, V7 directories, pax/long-name patches."""
        if flag == tarfile.AREGTYPE and name.endswith("/"):
            flag = tarfile.DIRTYPE
        if flag == tarfile.DIRTYPE:
            name = name.rstrip("/")
        if header[345] and flag not in tarfile.GNU_TYPES and header[257:263] == _USTAR:
            name = _text(header[345:500]) + "/" + name
        link = _text(header[157:257]) if flag == tarfile.LNKTYPE else None
        if "path" in self._globals:
            name = self._globals["path"].rstrip("/")
            if flag == tarfile.DIRTYPE:
                name = name.rstrip("/")
        if link is not None and "linkpath" in self._globals:
            link = self._globals["linkpath"]
        for kind, patch in reversed(patches):  # the outermost preamble wins
            if kind == tarfile.GNUTYPE_LONGNAME:
                name = patch.removesuffix("/") if flag == tarfile.DIRTYPE else patch
                continue
            if kind == tarfile.GNUTYPE_LONGLINK:
                link = patch if link is not None else None
                continue
            if "path" in patch:
                name = patch["path"].rstrip("/")
            if "linkpath" in patch and link is not None:
                link = patch["linkpath"]
            if "size" in patch:
                size = _pax_size(patch["size"])
        self._link = link
        if flag in _REGULAR:
            return True, name, size
        return False, name, 0 if flag in _NO_DATA else size

    def _with_tarfile(self, raw: list[bytes], skip: int) -> Iterator[tuple[str, bytes]]:
        """Read the rest of the archive with ``tarfile``, from the preamble in ``raw``."""
        base = self.offset
        self._links.note_origin(base + sum(map(len, raw)))
        chained = ChainedReader(b"".join(raw), self._read)
        tar = _tarfile_call(
            tarfile.open,
            fileobj=chained,
            mode="r|",
            tarinfo=StrictTarInfo,
            format=tarfile.PAX_FORMAT,
            pax_headers=dict(self._globals),
        )
        try:
            while (member := _tarfile_call(tar.next)) is not None:
                tar.members = []  # a stream: keep no list of every member
                self.offset = base + tar.offset
                if member.islnk():
                    data = self._links.read(member.name, member.linkname)
                    self.count += 1
                    if self.count > skip:
                        yield member.name, data
                    continue
                if not member.isfile():
                    continue
                self._links.targets[member.name] = (base + member.offset_data, member.size)
                if self._limit is not None and member.size > self._limit:
                    self._too_large(member.name, member.size, self.offset)
                handle = tar.extractfile(member)
                data = handle.read() if handle else b""
                self.count += 1
                if self.count > skip:
                    yield member.name, data
            self.offset = base + tar.offset
            self._after_end(tar.fileobj.read)  # type: ignore[union-attr]
        finally:
            tar.close()


def _tarfile_call(fn: Any, **kwargs: Any) -> Any:
    """``fn(**kwargs)``, with a corrupted field that ``tarfile`` lets through as a ReadError."""
    try:
        return fn(**kwargs)
    except (ValueError, OverflowError) as error:
        raise tarfile.ReadError(f"invalid member header ({error})") from error


class ChainedReader:
    """``head`` then the rest of a stream, read-only (the input ``tarfile`` resumes on)."""

    def __init__(self, head: bytes, read: Any) -> None:
        self._head, self._rest = head, read

    def read(self, size: int = -1) -> bytes:
        if not self._head:
            return self._rest(size)
        if size < 0 or size >= len(self._head):
            head, self._head = self._head, b""
            return head + self._rest(size - len(head) if size >= 0 else -1)
        head, self._head = self._head[:size], self._head[size:]
        return head
