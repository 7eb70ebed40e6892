"""Hard links in a tar stream: a link's member gets its target's bytes (``load_from_tar``).

GNU tar stores a file with several hard-linked names once: the first name holds
the data, each other name is a member of type ``1`` naming the first, with no
data. ``tarfile.extractfile`` gives such a member its target's bytes; so does
``load_from_tar``, by noting where each regular member's data lies and, at a
link, seeking back to read its target again. A stream that cannot seek
(an HTTP response, a decompressor) raises :class:`HardLinkError`.

Example:
    >>> import io, tarfile
    >>> buffer = io.BytesIO()
    >>> with tarfile.open(fileobj=buffer, mode="w") as tar:
    ...     info = tarfile.TarInfo("a.jpg"); info.size = 2
    ...     tar.addfile(info, io.BytesIO(b"hi"))
    ...     link = tarfile.TarInfo("b.jpg"); link.type, link.linkname = tarfile.LNKTYPE, "a.jpg"
    ...     tar.addfile(link)
    >>> from pipeloom.datapipes._tarstream import TarStream
    >>> list(TarStream(io.BytesIO(buffer.getvalue())).members())
    [('a.jpg', b'hi'), ('b.jpg', b'hi')]
"""

from __future__ import annotations

import posixpath
import tarfile
from typing import IO

__all__ = ["HardLinkError", "HardLinks"]


class HardLinkError(tarfile.StreamError):
    """A hard link whose target's data lies behind, in a stream that cannot seek back."""


class HardLinks:
    """Where each regular member's data lies, and the data of hard links to them.

    Args:
        stream: the stream the archive is read from.
        seekable: whether ``stream`` may be seeked back (None: ask ``stream.seekable()``).

    ``targets`` maps a member's name to ``(data offset in the archive, size)``;
    the reader fills it as it goes.
    """

    def __init__(self, stream: IO[bytes], seekable: bool | None) -> None:
        self.targets: dict[str, tuple[int, int]] = {}
        self._stream = stream
        self._seekable = seekable
        self._origin: int | None = None  # where the archive starts in ``stream``

    def note_origin(self, offset: int) -> None:
        """The stream is now at ``offset`` of the archive: note where the archive starts."""
        if self._origin is not None or self._seekable is False:
            return
        try:
            if self._seekable or self._stream.seekable():
                self._origin = self._stream.tell() - offset
                return
        except (AttributeError, OSError, ValueError):
            pass
        self._seekable = False

    def read(self, name: str, target: str, offset: int | None = None) -> bytes:
        """The data of hard link ``name``: its ``target``'s, read again by seeking back.

        ``offset``: where the stream is now in the archive, if the origin is not noted yet.
        """
        found = self.targets.get(target)
        if found is None:  # tarfile compares normalized names: "./a" is "a"
            wanted = posixpath.normpath(target)
            found = next(
                (at for key, at in self.targets.items() if posixpath.normpath(key) == wanted),
                None,
            )
        if found is None:
            raise tarfile.ReadError(
                f"member {name[:200]!r} is a hard link to {target[:200]!r}, which is not an "
                f"earlier regular file of the archive (recreate the shard with "
                f"`tar --hard-dereference` so every member holds its data)"
            )
        if offset is not None:
            self.note_origin(offset)
        if self._origin is None:
            raise HardLinkError(
                f"member {name[:200]!r} is a hard link to {target[:200]!r}, whose data was "
                f"earlier in the stream, and this stream cannot seek back to read it again "
                f"(an HTTP response, a compressed shard): recreate the shard with GNU tar's "
                f"`--hard-dereference` so every member holds its data, or read it as an "
                f"uncompressed local file"
            )
        start, size = found
        stream = self._stream
        here = stream.tell()
        try:
            stream.seek(self._origin + start)
            data = stream.read(size)
        finally:
            stream.seek(here)
        if len(data) != size:
            raise tarfile.ReadError(
                f"the target {target[:200]!r} of hard link {name[:200]!r} could not be read "
                f"again ({len(data)} of {size} bytes)"
            )
        self.targets[name] = found
        return data
