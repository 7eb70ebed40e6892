"""Read tar shards member by member, streaming (``load_from_tar``).

The archive is read front to back and never seeked (but to read a hard link's
target again, see ``_tarlinks.py``), so any file object works: local files,
HTTP responses, fsspec streams. Each regular member comes out as
``(f"{shard}/{member}", bytes)``. Headers are parsed by :class:`TarStream`
(``_tarstream.py``), a lean reader giving the same members as ``tarfile``.

A truncated or corrupted shard raises ``tarfile.ReadError`` naming the shard,
the member count and the byte offset (a missing end-of-archive marker, a lone
zero block followed by more data and a compressed stream failing its checksum
all count, so no data is dropped silently); ``on_error="skip"`` or ``"warn"``
instead drop the rest of that shard and go on with the next. A failure of the
stream itself (an I/O or network error) is always raised.

Example:
    >>> import io, tarfile
    >>> buffer = io.BytesIO()
    >>> with tarfile.open(fileobj=buffer, mode="w") as tar:
    ...     for name, data in [("a.txt", b"hi"), ("b.cls", b"3")]:
    ...         info = tarfile.TarInfo(name); info.size = len(data)
    ...         tar.addfile(info, io.BytesIO(data))
    >>> from pipeloom.datapipes import IterableWrapper
    >>> shard = IterableWrapper([("s.tar", io.BytesIO(buffer.getvalue()))])
    >>> list(TarArchiveLoader(shard))
    [('s.tar/a.txt', b'hi'), ('s.tar/b.cls', b'3')]
"""

from __future__ import annotations

import gzip
import lzma
import tarfile
import warnings
import zlib
from collections.abc import Iterator
from typing import IO, Any

from ._base import IterDataPipe
from ._files import StreamReader
from ._streams import open_streams
from ._tarlinks import HardLinkError
from ._tarstream import ChainedReader, TarStream

__all__ = ["TarArchiveLoader", "TarMemberPath"]

_MODES = ("r|", "r|*", "r|gz", "r|bz2", "r|xz", "r", "r:", "r:*", "r:gz", "r:bz2", "r:xz")
_ON_ERROR = ("raise", "skip", "warn")
_ERRORS = (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError)


class TarMemberPath(str):
    """The ``str`` path of a tar member that also knows its ``shard`` and ``member``.

    >>> p = TarMemberPath("data/s0.tar", "x/0001.jpg")
    >>> p, p.shard, p.member
    ('data/s0.tar/x/0001.jpg', 'data/s0.tar', 'x/0001.jpg')
    """

    shard: str
    member: str

    def __new__(cls, shard: str, member: str) -> TarMemberPath:
        path = super().__new__(cls, f"{shard}/{member}")
        path.shard, path.member = shard, member
        return path

    def __reduce__(self) -> tuple[Any, ...]:
        return TarMemberPath, (self.shard, self.member)


_MAGIC = (  # (decompressor, first bytes), as tarfile's "r|*" detects them
    ("gzip", b"\x1f\x8b\x08"),
    ("bz2", b"BZh"),
    ("lzma", b"\xfd7zXZ\x00"),
    ("lzma", b"\x5d\x00\x00\x80"),
)
_COMPRESSION = {"gz": "gzip", "bz2": "bz2", "xz": "lzma"}


class _Source:
    """The shard's stream, remembering whether reading *it* failed (I/O, network).

    A failure of the stream itself is not a property of the data: it is
    raised whatever ``on_error`` says, so a network error never passes as a
    corrupted record that may be skipped. Decompressors raise ``OSError`` for
    damaged data too, so they read through this; a plain tar is read from the
    stream directly (its damage is always a ``tarfile.TarError``).
    """

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.failed = False

    def read(self, size: int = -1) -> bytes:
        try:
            return self.stream.read(size)
        except BaseException:
            self.failed = True
            raise


def _decompressed(stream: Any, module: str) -> IO[bytes]:
    if module == "gzip":
        return gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[return-value]
    return open_streams(stream, "bz2" if module == "bz2" else "xz")


def _open(source: _Source, mode: str, limit: int | None) -> tuple[TarStream, IO[bytes] | None]:
    """A TarStream over ``source``, decompressed as ``mode`` says (and the decompressor)."""
    compression = mode[2:] if len(mode) > 2 else "*"
    if compression in _COMPRESSION:
        inner = _decompressed(source, _COMPRESSION[compression])
        return TarStream(inner, max_member_size=limit, seekable=False), inner
    if mode in ("r|", "r:"):
        return TarStream(source.stream, max_member_size=limit), None
    head = b""  # "r", "r|*", "r:*": a tar header, or compressed data?
    while len(head) < tarfile.BLOCKSIZE and (more := source.read(tarfile.BLOCKSIZE - len(head))):
        head += more
    for module, magic in _MAGIC:
        if head.startswith(magic) and not _is_header(head):
            inner = _decompressed(ChainedReader(head, source.read), module)
            return TarStream(inner, max_member_size=limit, seekable=False), inner
    return TarStream(source.stream, head, max_member_size=limit), None


def _is_header(block: bytes) -> bool:
    if len(block) != tarfile.BLOCKSIZE:
        return False
    try:
        return tarfile.nti(block[148:156]) in tarfile.calc_chksums(block)  # type: ignore[attr-defined]
    except tarfile.HeaderError:
        return False


class TarArchiveLoader(StreamReader):
    """Yield ``(f"{shard}/{member}", bytes)`` for each regular file in each tar stream.

    A hard link comes out with its target's bytes (the target is read again by
    seeking back, so the shard must be an uncompressed seekable file; else a
    ``tarfile.StreamError`` says to recreate it with ``tar --hard-dereference``).
    Directories and symbolic links are skipped.

    Args:
        source: a block yielding ``(shard_path, stream)``, e.g. ``open_files("rb")``.
        mode: a ``tarfile`` read mode. None of them seeks: ``"r|*"`` (default),
            ``"r:*"`` and ``"r"`` read plain tars and detect gzip/bz2/xz,
            ``"r|"`` and ``"r:"`` read plain tars only, ``"r|gz"`` etc. name
            the compression.
        length: the value ``len()`` returns, as in torchdata; ``-1`` (default)
            means no length.
        on_error: ``"raise"`` (default), ``"warn"`` or ``"skip"`` — what to do
            with a corrupted or truncated shard; the last two drop the rest of
            the shard and continue with the next one. Only the *data* is
            covered: an error of the stream itself (a failed read, a network
            error after the opener's retries) is always raised.
        max_member_size: the largest member accepted, in bytes (default 4 GiB;
            None for no limit). A header claiming more is taken as corrupted.

    Each shard's stream is read to its end (the bytes after the end-of-archive
    marker must be zeros; a compressed shard's checksum is verified there) and
    closed. Resuming mid-shard re-opens the shard (see ``StreamOpener``) and
    skips the members already emitted.

    ``cut_short`` is the set of shards whose rest ``"warn"``/``"skip"`` dropped
    this epoch; ``webdataset()`` right after this block drops the last sample of
    each, which may lack the members lost with the rest.
    """

    def __init__(
        self,
        source: IterDataPipe,
        mode: str = "r|*",
        length: int = -1,
        on_error: str = "raise",
        max_member_size: int | None = 1 << 32,
    ) -> None:
        super().__init__(source)
        if mode not in _MODES:
            raise ValueError(
                f"mode must be a tarfile read mode, one of {', '.join(_MODES)}; got "
                f"{mode!r}. Use 'r|*' to stream possibly compressed shards"
            )
        if isinstance(length, bool) or not isinstance(length, int) or length < -1:
            raise ValueError(f"length must be an int >= 0, or -1 for no length; got {length!r}")
        if on_error not in _ON_ERROR:
            raise ValueError(f"on_error must be one of {_ON_ERROR}, got {on_error!r}")
        if max_member_size is not None and (
            isinstance(max_member_size, bool)
            or not isinstance(max_member_size, int)
            or max_member_size < 0
        ):
            raise ValueError(
                f"max_member_size must be a number of bytes >= 0 or None, got {max_member_size!r}"
            )
        self.mode = mode
        self.length = length
        self.on_error = on_error
        self.max_member_size = max_member_size
        # Shards whose rest was dropped this epoch (on_error "skip"/"warn"): a sample
        # grouped from their last members may lack fields (``webdataset`` drops it).
        self.cut_short: set[str] = set()

    def reset(self) -> None:
        super().reset()
        self.cut_short = set()

    def __len__(self) -> int:
        if self.length < 0:
            raise TypeError(
                "TarArchiveLoader has no length: pass length=<number of members> to "
                "load_from_tar() if you know it"
            )
        return self.length

    def _read(self, path: str, stream: IO[bytes], skip: int) -> Iterator[tuple[str, bytes]]:
        reader = inner = None
        source = _Source(stream)
        try:
            reader, inner = _open(source, self.mode, self.max_member_size)
            for member, data in reader.members(skip):
                yield TarMemberPath(path, member), data
        except HardLinkError as error:  # not damage: on_error does not drop it
            raise HardLinkError(f"tar shard {path!r}: {error}") from None
        except _ERRORS as error:
            if source.failed or (inner is None and not isinstance(error, tarfile.TarError)):
                raise  # the stream itself failed: not a corrupted record
            self._failed(path, error, reader, compressed=inner is not None)
        finally:
            if inner is not None:
                inner.close()

    def _failed(
        self, path: str, error: BaseException, reader: TarStream | None, compressed: bool
    ) -> None:
        started = reader is not None and reader.started
        what = "is corrupted or truncated" if started else "is not a readable tar archive"
        if not started and self.mode in ("r|", "r:") and str(error) != "empty file":
            what += " (if it is compressed, use mode='r|*')"
        offset, count = (reader.offset, reader.count) if reader is not None else (0, 0)
        at = f"byte offset {offset}" + (" of the decompressed data" if compressed else "")
        message = (
            f"tar shard {path!r} {what}: {error} (at {at}, after {count} member(s); "
            f"mode={self.mode!r})"
        )
        # A compressed stream is verified only as it is read: members already
        # delivered from it may hold damaged bytes, so the user must hear of it.
        suspect = compressed and count > 0
        if suspect:
            message += (
                f"; the {count} member(s) already read from this compressed shard may be "
                f"damaged (its checksum is only verified at its end)"
            )
        if self.on_error == "raise":
            raise tarfile.ReadError(
                message + "; pass on_error='warn' or 'skip' to drop the rest of "
                "the shard and continue"
            ) from error
        self.cut_short.add(path)
        if self.on_error == "warn" or suspect:
            warnings.warn(message + "; skipping the rest of this shard", UserWarning, stacklevel=3)

    def __repr__(self) -> str:
        length = f", length={self.length}" if self.length >= 0 else ""
        return f"TarArchiveLoader(mode={self.mode!r}{length}, on_error={self.on_error!r})"
