"""Read tar shards member by member, streaming (``load_from_tar``).

The archive is read front to back (``tarfile`` stream mode ``"r|..."``), so
any file object works: local files, HTTP responses, fsspec streams. Each
regular member comes out as ``(f"{shard}/{member}", bytes)``.

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

import tarfile
import warnings
import zlib
from collections.abc import Iterator
from typing import IO, Any

from ._base import IterDataPipe
from ._files import StreamReader

__all__ = ["TarArchiveLoader", "TarMemberPath"]

_MODES = ("r|", "r|*", "r|gz", "r|bz2", "r|xz", "r", "r:", "r:*", "r:gz", "r:bz2", "r:xz")
_ON_ERROR = ("raise", "skip", "warn")


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


class _StrictTarInfo(tarfile.TarInfo):
    """Treats a truncated or invalid header as an error, not as the end of the archive."""

    @classmethod
    def fromtarfile(cls, tar: tarfile.TarFile) -> tarfile.TarInfo:
        try:
            return super().fromtarfile(tar)
        except tarfile.EOFHeaderError:
            raise  # the end-of-archive marker: a complete archive
        except (tarfile.EmptyHeaderError, tarfile.TruncatedHeaderError):
            raise tarfile.ReadError(
                "unexpected end of data (truncated: no end-of-archive marker)"
            ) from None
        except tarfile.InvalidHeaderError as error:
            raise tarfile.ReadError(f"invalid member header ({error})") from None


def _seekable(stream: IO[bytes]) -> bool:
    try:
        return bool(stream.seekable()) and stream.tell() == 0
    except (AttributeError, OSError, ValueError):
        return False


class TarArchiveLoader(StreamReader):
    """Yield ``(f"{shard}/{member}", bytes)`` for each regular file in each tar stream.

    Args:
        source: a block yielding ``(shard_path, stream)``, e.g. ``open_files("rb")``.
        mode: a ``tarfile`` read mode; ``"r|"`` / ``"r|*"`` stream (no seeking;
            ``"r|*"`` also reads gzip/bz2/xz), ``"r:*"`` needs a seekable file.
            A seekable stream (a local file) is read with the matching ``"r:"``
            mode, which gives the same members with fewer copies.
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
        count, tar = 0, None
        try:
            mode = self.mode
            if mode in ("r|", "r|*") and _seekable(stream):
                mode = mode.replace("|", ":")  # same members, fewer copies than stream mode
            tar = tarfile.open(fileobj=stream, mode=mode, tarinfo=_StrictTarInfo)
            while (member := tar.next()) is not None:
                if not member.isfile():
                    continue
                count += 1
                if count <= skip:
                    continue
                handle = tar.extractfile(member)
                yield TarMemberPath(path, member.name), handle.read() if handle else b""
        except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
            offset = tar.offset if tar is not None else 0
            what = "is not a readable tar archive" if tar is None else "is corrupted or truncated"
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
                warnings.warn(message + "; skipping the rest of this shard", UserWarning,
                              stacklevel=2)
        finally:
            if tar is not None:
                tar.close()

    def __repr__(self) -> str:
        return f"TarArchiveLoader(mode={self.mode!r}, on_error={self.on_error!r})"
