"""Read tar shards member by member, streaming (``load_from_tar``).

The archive is read front to back and never seeked, so any file object works:
local files, HTTP responses, fsspec streams. Each regular member comes out as
``(f"{shard}/{member}", bytes)``. Headers are parsed by :class:`TarStream`
(``_tarstream.py``), a lean reader giving the same members as ``tarfile``.

A truncated or corrupted shard raises ``tarfile.ReadError`` naming the shard,
the member count and the byte offset (a missing end-of-archive marker counts
as truncation, so no data is dropped silently); ``on_error="skip"`` or
``"warn"`` instead drop the rest of that shard and go on with the next.

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

import bz2
import gzip
import lzma
import tarfile
import warnings
import zlib
from collections.abc import Iterator
from typing import IO, Any

from ._base import IterDataPipe
from ._files import StreamReader
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


def _decompressed(stream: IO[bytes], module: str) -> IO[bytes]:
    if module == "gzip":
        return gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[return-value]
    if module == "bz2":
        return bz2.BZ2File(stream)  # type: ignore[return-value]
    return lzma.LZMAFile(stream)  # type: ignore[return-value]


def _open(stream: IO[bytes], mode: str) -> tuple[TarStream, IO[bytes] | None]:
    """A TarStream over ``stream``, decompressed as ``mode`` says (and the decompressor)."""
    compression = mode[2:] if len(mode) > 2 else "*"
    if compression in _COMPRESSION:
        inner = _decompressed(stream, _COMPRESSION[compression])
        return TarStream(inner), inner
    if mode in ("r|", "r:"):
        return TarStream(stream), None
    head = stream.read(tarfile.BLOCKSIZE)  # "r", "r|*", "r:*": a tar header, or compressed data?
    for module, magic in _MAGIC:
        if head.startswith(magic) and not _is_header(head):
            inner = _decompressed(ChainedReader(head, stream.read), module)  # type: ignore[arg-type]
            return TarStream(inner), inner
    return TarStream(stream, head), None


def _is_header(block: bytes) -> bool:
    if len(block) != tarfile.BLOCKSIZE:
        return False
    try:
        return tarfile.nti(block[148:156]) in tarfile.calc_chksums(block)  # type: ignore[attr-defined]
    except tarfile.HeaderError:
        return False


class TarArchiveLoader(StreamReader):
    """Yield ``(f"{shard}/{member}", bytes)`` for each regular file in each tar stream.

    Args:
        source: a block yielding ``(shard_path, stream)``, e.g. ``open_files("rb")``.
        mode: a ``tarfile`` read mode. None of them seeks: ``"r|"`` and ``"r:"``
            read plain tars, ``"r|*"``, ``"r:*"`` and ``"r"`` also detect
            gzip/bz2/xz, ``"r|gz"`` etc. name the compression.
        on_error: ``"raise"`` (default), ``"warn"`` or ``"skip"`` — what to do
            with a corrupted or truncated shard; the last two drop the rest of
            the shard and continue with the next one.

    Each shard's stream is closed when it is read to its end or fails. Resuming
    mid-shard re-opens the shard (see ``StreamOpener``) and skips the members
    already emitted.
    """

    def __init__(self, source: IterDataPipe, mode: str = "r|", on_error: str = "raise") -> None:
        super().__init__(source)
        if mode not in _MODES:
            raise ValueError(
                f"mode must be a tarfile read mode, one of {', '.join(_MODES)}; got "
                f"{mode!r}. Use 'r|*' to stream possibly compressed shards"
            )
        if on_error not in _ON_ERROR:
            raise ValueError(f"on_error must be one of {_ON_ERROR}, got {on_error!r}")
        self.mode = mode
        self.on_error = on_error

    def _read(self, path: str, stream: IO[bytes], skip: int) -> Iterator[tuple[str, bytes]]:
        reader = inner = None
        try:
            reader, inner = _open(stream, self.mode)
            for member, data in reader.members(skip):
                yield TarMemberPath(path, member), data
        except _ERRORS as error:
            self._failed(path, error, reader)
        finally:
            if inner is not None:
                inner.close()

    def _failed(self, path: str, error: BaseException, reader: TarStream | None) -> None:
        started = reader is not None and reader.started
        what = "is corrupted or truncated" if started else "is not a readable tar archive"
        if not started and self.mode in ("r|", "r:") and str(error) != "empty file":
            what += " (if it is compressed, use mode='r|*')"
        offset, count = (reader.offset, reader.count) if reader is not None else (0, 0)
        message = (
            f"tar shard {path!r} {what}: {error} (at byte offset {offset}, after "
            f"{count} member(s); mode={self.mode!r})"
        )
        if self.on_error == "raise":
            raise tarfile.ReadError(
                message + "; pass on_error='warn' or 'skip' to drop the rest of "
                "the shard and continue"
            ) from error
        if self.on_error == "warn":
            warnings.warn(message + "; skipping the rest of this shard", UserWarning, stacklevel=3)

    def __repr__(self) -> str:
        return f"TarArchiveLoader(mode={self.mode!r}, on_error={self.on_error!r})"
