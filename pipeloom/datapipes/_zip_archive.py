"""``load_from_zip``: the member files of zip archives."""

from __future__ import annotations

import io
import lzma
import zipfile
import zlib
from collections.abc import Iterator
from typing import IO, Any

from ._base import IterDataPipe
from ._decompress import check_length
from ._files import StreamReader

__all__ = ["ZipArchiveLoader"]


# What zipfile raises on damaged bytes besides BadZipFile: a damaged compression method
# (NotImplementedError), a negative offset (ValueError), cut or broken deflate/bz2/lzma
# data (EOFError, zlib.error, LZMAError), a damaged flag bit (RuntimeError: "encrypted").
_READ_ERRORS = (
    zipfile.BadZipFile,
    OSError,
    EOFError,
    ValueError,
    NotImplementedError,
    RuntimeError,
    zlib.error,
    lzma.LZMAError,
)


def _check_count(archive: zipfile.ZipFile, path: str) -> None:
    """Raise unless the central directory gave as many members as its end record lists.

    ``zipfile`` reads directory entries until the directory's size is used up
    and never compares their number with the end record's: a damaged name or
    extra-field length there swallows the entries after it, silently.
    """
    end_record = getattr(zipfile, "_EndRecData", None)  # private, stable since Python 2
    total = getattr(zipfile, "_ECD_ENTRIES_TOTAL", None)
    if end_record is None or total is None or archive.fp is None:
        return
    record = end_record(archive.fp)
    if record is None:
        return
    listed, found = record[total], len(archive.infolist())
    # Writers without ZIP64 (Java 6's ZipOutputStream, ...) store the count of an archive
    # of more than 65535 members modulo 65536 in its 16-bit field; zipfile reads them all.
    if listed != found and not (found > 0xFFFF and listed == found & 0xFFFF):
        raise zipfile.BadZipFile(
            f"zip archive {path!r}: its end record lists {listed} member(s) but its central "
            f"directory holds {found}: the directory is damaged, and members would be lost"
        )


def _is_directory(info: zipfile.ZipInfo, path: str) -> bool:
    """Whether a central directory entry is a directory; raise if its name is damaged.

    ``zipfile`` cuts a name at its first NUL byte, and a name ending in ``/``
    is a directory: one changed byte would turn a member into an empty name or
    into a directory that is skipped, silently. A directory holds no data.
    """
    if not info.filename:
        raise zipfile.BadZipFile(
            f"zip archive {path!r}: a central directory entry has an empty name: "
            "the directory is damaged"
        )
    if not info.is_dir():
        return False
    if info.file_size:
        raise zipfile.BadZipFile(
            f"zip archive {path!r}: entry {info.filename!r} is named as a directory but holds "
            f"{info.file_size} bytes: the directory is damaged, and a member would be lost"
        )
    return True


class ZipArchiveLoader(StreamReader):
    """Yield ``(f"{archive_path}/{member}", stream)`` for each file in each zip archive.

    Functional: ``load_from_zip``. Directories are skipped. The member's name
    is kept as stored (``./a.txt``, ``x/../y``, ``/abs``), and the archive's
    path or URL as given: torchdata joined them with ``os.path.normpath``, which
    merged ``"a//b"`` and ``"a/b"``, dropped the archive before an absolute name
    and turned ``"http://"`` into ``"http:/"``. Each member is
    read into memory and handed out as an ``io.BytesIO``, so it can be read
    later, in another process, after the archive is closed. A zip archive is
    read from its end (the central directory): a stream that cannot seek
    (HTTP) is first read whole into memory.

    Args:
        source: a block yielding ``(path, binary stream)`` or ``(path, bytes)``.
        length: the value of ``len()`` (``-1``: no length).

    Raises (while iterating):
        zipfile.BadZipFile: naming the archive.

    Example:
        >>> import io, zipfile
        >>> buffer = io.BytesIO()
        >>> with zipfile.ZipFile(buffer, "w") as archive:
        ...     archive.writestr("a/1.txt", "one")
        >>> from pipeloom.datapipes import IterableWrapper
        >>> files = IterableWrapper([("d.zip", io.BytesIO(buffer.getvalue()))])
        >>> [(path, stream.read()) for path, stream in files.load_from_zip()]
        [('d.zip/a/1.txt', b'one')]
    """

    def __init__(self, source: IterDataPipe, length: int = -1) -> None:
        super().__init__(source)
        self.length = check_length(length)

    def _read(self, path: str, stream: IO[Any], skip: int) -> Iterator[tuple[str, io.BytesIO]]:
        if isinstance(stream, io.TextIOBase):
            raise TypeError(
                f"zip archive {path!r} was opened in text mode; use open_files(mode='rb')"
            )
        seekable = getattr(stream, "seekable", None)
        if seekable is None or not seekable():
            stream = io.BytesIO(stream.read())
        try:
            archive = zipfile.ZipFile(stream)
        except _READ_ERRORS as error:
            raise zipfile.BadZipFile(f"{path!r} is not a readable zip archive: {error}") from error
        with archive:
            _check_count(archive, path)
            members = [info for info in archive.infolist() if not _is_directory(info, path)]
            for info in members[skip:]:
                try:
                    data = archive.read(info)
                except _READ_ERRORS as error:
                    raise zipfile.BadZipFile(
                        f"zip archive {path!r}: member {info.filename!r} is corrupted or "
                        f"unreadable: {type(error).__name__}: {error}"
                    ) from error
                yield f"{path}/{info.filename}", io.BytesIO(data)

    def __len__(self) -> int:
        if self.length == -1:
            raise TypeError(
                "ZipArchiveLoader has no length unless given one; pass load_from_zip(length=N)"
            )
        return self.length

    def __repr__(self) -> str:
        return f"ZipArchiveLoader(length={self.length})"
