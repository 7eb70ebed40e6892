"""Compressed files: ``decompress``/``extract``, ``load_from_bz2``, ``load_from_xz``.

Each ``(path, stream)`` becomes ``(path, decompressed stream)``. Decompression
is lazy: the data is decompressed as the next block reads it. Closing the
decompressed stream (readers do, at its end) also closes the file under it.

Example:
    >>> import bz2, io
    >>> from pipeloom.datapipes import IterableWrapper
    >>> files = IterableWrapper([("notes.txt.bz2", io.BytesIO(bz2.compress(b"hi\\n")))])
    >>> [(path, stream.read()) for path, stream in files.load_from_bz2()]
    [('notes.txt', b'hi\\n')]
"""

from __future__ import annotations

import enum
import gzip
import io
import lzma
import tarfile
import zipfile
import zlib
from typing import IO, Any

from ._base import IterDataPipe
from ._names import file_name
from ._streams import open_streams

__all__ = ["Bz2FileLoader", "CompressionType", "Decompressor", "XzFileLoader"]


class CompressionType(enum.Enum):
    """The formats ``decompress`` knows (torchdata's names)."""

    GZIP = "gzip"
    LZMA = "lzma"
    TAR = "tar"
    ZIP = "zip"
    BZIP2 = "bz2"


_ALIASES = {"gz": CompressionType.GZIP, "xz": CompressionType.LZMA}
_BY_SUFFIX = {
    ".tar.gz": CompressionType.TAR,
    ".tar.xz": CompressionType.TAR,
    ".tar": CompressionType.TAR,
    ".xz": CompressionType.LZMA,
    ".gz": CompressionType.GZIP,
    ".zip": CompressionType.ZIP,
    ".bz2": CompressionType.BZIP2,
}


class _Decompressed(io.RawIOBase):
    """A decompressing reader that closes the compressed file with itself.

    A damaged or truncated file (the format's CRC, length or end marker) raises
    the decompressor's error type with the file's path and format in front.
    """

    def __init__(
        self, inner: IO[bytes], outer: IO[Any], path: str, kind: str, read: _Counted | None = None
    ) -> None:
        self._inner, self._outer = inner, outer
        self._path, self._kind = path, kind
        self._read = read  # gzip's input, counted: an empty file is no gzip file

    @property
    def wrapped_stream(self) -> IO[Any]:
        """The compressed stream under this one (a reader's claim reaches it)."""
        return self._outer

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            data = self._inner.read(len(buffer))
            if not data and self._read is not None and not self._read.count:
                raise EOFError("the file is empty (0 bytes), with no gzip header")
        except (EOFError, OSError, lzma.LZMAError, zlib.error) as error:
            raise _named(error, self._path, self._kind) from error
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            try:
                self._inner.close()
            finally:
                self._outer.close()
                super().close()


class _Counted:
    """A stream's ``read``, counting the bytes it gave (``GzipFile`` reads an empty
    file as empty data, where bz2 and xz say it ends before their end marker)."""

    def __init__(self, stream: IO[Any]) -> None:
        self._stream = stream
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.count += len(data)
        return data


def _named(error: BaseException, path: str, kind: str) -> BaseException:
    """``error`` again, of its type, its message naming the file (unless it already does)."""
    text = str(error)
    if path in text:  # e.g. an HTTP stream's error, naming its URL
        return error
    message = f"cannot decompress {path!r} ({kind}): {text or type(error).__name__}"
    if isinstance(error, EOFError):
        message += "; the file is truncated"
    try:
        return type(error)(message)
    except Exception:  # an exception type with other arguments
        return OSError(message)


def decompressed(stream: IO[Any], kind: CompressionType, path: str) -> Any:
    """Open ``stream`` (binary) as ``kind``: a buffered reader, or a TarFile/ZipFile."""
    if isinstance(stream, io.TextIOBase) or not hasattr(stream, "read"):
        raise TypeError(
            f"{path!r} must be a binary stream to decompress, got {type(stream).__name__}; "
            f"open the files with open_files(mode='rb')"
        )
    if kind is CompressionType.TAR:
        return tarfile.open(fileobj=stream, mode="r:*")
    if kind is CompressionType.ZIP:
        return zipfile.ZipFile(stream)
    if kind is CompressionType.GZIP:
        counted = _Counted(stream)
        inner: IO[bytes] = gzip.GzipFile(fileobj=counted, mode="rb")  # type: ignore[assignment,call-overload]
        return io.BufferedReader(_Decompressed(inner, stream, path, kind.value, counted))
    inner = open_streams(stream, "xz" if kind is CompressionType.LZMA else "bz2")
    return io.BufferedReader(_Decompressed(inner, stream, path, kind.value))


def check_length(length: Any) -> int:
    """Raise ValueError unless ``length`` is -1 (no length) or an int >= 0."""
    if isinstance(length, bool) or not isinstance(length, int) or length < -1:
        raise ValueError(f"length must be an int >= 0, or -1 for no length; got {length!r}")
    return length


def _pair(item: Any, owner: str) -> tuple[str, Any]:
    if not (isinstance(item, tuple) and len(item) == 2):
        raise TypeError(
            f"{owner}() expects (path, stream) items, got {type(item).__name__}; put it "
            f"after open_files(mode='rb') or an HTTP/fsspec opener"
        )
    path, stream = item
    if isinstance(stream, (bytes, bytearray)):
        stream = io.BytesIO(stream)
    return str(path), stream


class Decompressor(IterDataPipe):
    """Decompress each ``(path, stream)``; functional: ``decompress`` (alias ``extract``).

    The format is ``file_type`` or, when None, the suffix of the path (of a
    URL's path: ``x.tar.gz?sig=abc`` is a ``.tar.gz``): ``.tar``,
    ``.tar.gz``, ``.tar.xz`` (a ``tarfile.TarFile``), ``.zip`` (a
    ``zipfile.ZipFile``), ``.gz``, ``.xz``, ``.bz2`` (a decompressing binary
    stream). The path is kept. To read the members of archives, prefer
    ``load_from_tar()`` and ``load_from_zip()``.

    Args:
        source: a block yielding ``(path, binary stream)``.
        file_type: ``"gzip"``, ``"lzma"`` (or ``"xz"``), ``"bz2"``, ``"tar"``,
            ``"zip"``, a :class:`CompressionType`, or None to detect.

    Example:
        >>> import gzip, io
        >>> from pipeloom.datapipes import IterableWrapper
        >>> files = IterableWrapper([("a.gz", io.BytesIO(gzip.compress(b"data")))])
        >>> [(p, s.read()) for p, s in files.decompress()]
        [('a.gz', b'data')]
    """

    inputs = ("source",)
    per_item = True
    one_to_one = True
    types = CompressionType

    def __init__(
        self, source: IterDataPipe, file_type: str | CompressionType | None = None
    ) -> None:
        self.source = source
        self.file_type = _as_type(file_type)

    def async_next(self) -> tuple[str, Any]:
        path, stream = _pair(self.source.async_next(), "decompress")
        return path, decompressed(stream, self.file_type or _detect(path), path)

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        kind = None if self.file_type is None else self.file_type.value
        return f"Decompressor(file_type={kind!r})"


def _as_type(file_type: Any) -> CompressionType | None:
    if file_type is None or isinstance(file_type, CompressionType):
        return file_type
    if isinstance(file_type, str):
        name = file_type.lower()
        if name in _ALIASES:
            return _ALIASES[name]
        try:
            return CompressionType(name)
        except ValueError:
            pass
    known = [t.value for t in CompressionType] + list(_ALIASES)
    raise ValueError(
        f"file_type must be one of {known}, a CompressionType or None (detect from the "
        f"suffix), got {file_type!r}"
    )


def _detect(path: str) -> CompressionType:
    name = file_name(path).lower()  # a signed URL's query is not part of its name
    for suffix, kind in _BY_SUFFIX.items():
        if name.endswith(suffix):
            return kind
    raise ValueError(
        f"cannot tell the compression of {path!r} from its suffix (known: "
        f"{', '.join(_BY_SUFFIX)}); pass decompress(file_type=...)"
    )


class _SingleFileLoader(IterDataPipe):
    """Decompress each stream of one format, dropping the format's suffix from the path."""

    inputs = ("source",)
    per_item = True
    one_to_one = True
    kind: CompressionType = CompressionType.BZIP2
    suffix = ".bz2"
    functional_name = "load_from_bz2"

    def __init__(self, source: IterDataPipe, length: int = -1) -> None:
        self.source = source
        self.length = check_length(length)

    def async_next(self) -> tuple[str, Any]:
        path, stream = _pair(self.source.async_next(), self.functional_name)
        name = path[: -len(self.suffix)] if path.endswith(self.suffix) else path
        return name, decompressed(stream, self.kind, path)

    def __len__(self) -> int:
        if self.length == -1:
            raise TypeError(
                f"{type(self).__name__} has no length unless given one; pass "
                f"{self.functional_name}(length=N)"
            )
        return self.length

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(length={self.length})"


class Bz2FileLoader(_SingleFileLoader):
    """Decompress bzip2 streams: ``(path.bz2, s)`` -> ``(path, bytes stream)``.

    Functional: ``load_from_bz2``. Only a trailing ``.bz2`` is removed (torchdata
    0.9 removed any trailing run of the characters ``.``, ``b``, ``z``, ``2``,
    so ``"v2.bz2"`` became ``"v"``; pipeloom gives ``"v2"``).
    """

    kind = CompressionType.BZIP2
    suffix = ".bz2"
    functional_name = "load_from_bz2"


class XzFileLoader(_SingleFileLoader):
    """Decompress xz/lzma streams: ``(path.xz, s)`` -> ``(path, bytes stream)``.

    Functional: ``load_from_xz``. Only a trailing ``.xz`` is removed.

    Example:
        >>> import io, lzma
        >>> from pipeloom.datapipes import IterableWrapper
        >>> files = IterableWrapper([("box.xz", io.BytesIO(lzma.compress(b"x")))])
        >>> [(p, s.read()) for p, s in files.load_from_xz()]
        [('box', b'x')]
    """

    kind = CompressionType.LZMA
    suffix = ".xz"
    functional_name = "load_from_xz"
