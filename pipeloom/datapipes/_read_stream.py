"""``read_from_stream``: each stream's content, whole or in chunks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

from ._base import IterDataPipe
from ._files import StreamReader

__all__ = ["StreamChunkReader"]


class StreamChunkReader(StreamReader):
    """Yield ``(path, chunk)`` for each ``chunk``-sized read of each stream.

    Functional: ``read_from_stream``. ``chunk=None`` reads each stream whole
    (one item per stream). Chunks are ``bytes`` for binary streams and ``str``
    for text streams; each stream is closed at its end.

    Args:
        source: a block yielding ``(path, stream)``.
        chunk: the size of each read; None for the whole stream.

    Example:
        >>> import io
        >>> from pipeloom.datapipes import IterableWrapper
        >>> files = IterableWrapper([("alphabet", io.StringIO("abcde"))])
        >>> list(files.read_from_stream(chunk=2))
        [('alphabet', 'ab'), ('alphabet', 'cd'), ('alphabet', 'e')]
    """

    def __init__(self, source: IterDataPipe, chunk: int | None = None) -> None:
        super().__init__(source)
        if chunk is not None and (
            isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1
        ):
            raise ValueError(
                f"chunk must be an int >= 1 (bytes or characters per read), or None to read "
                f"each stream whole; got {chunk!r}"
            )
        self.chunk = chunk

    def _read(self, path: str, stream: IO[Any], skip: int) -> Iterator[tuple[str, Any]]:
        if skip and self.chunk is not None:
            _read_full(stream, skip * self.chunk)  # resume: the chunks already handed out
        elif skip:
            return  # the whole stream was handed out already
        size = -1 if self.chunk is None else self.chunk
        while True:
            data = _read_full(stream, size)
            if not data:
                return
            yield path, data
            if self.chunk is None:
                return

    def __repr__(self) -> str:
        return f"StreamChunkReader(chunk={self.chunk})"


def _read_full(stream: IO[Any], size: int) -> Any:
    """``stream.read(size)``, shorter only at the end of the stream.

    A raw stream (a pipe, a socket) may return fewer bytes than asked before
    its end; its chunks would then not be ``chunk``-sized, and a resumed reader
    would skip the wrong number of bytes.
    """
    data = stream.read(size)
    if size < 0 or not data or len(data) == size:
        return data
    parts = [data]
    left = size - len(data)
    while left and (more := stream.read(left)):
        parts.append(more)
        left -= len(more)
    return data[:0].join(parts)
