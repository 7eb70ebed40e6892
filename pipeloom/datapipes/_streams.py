"""Concatenated bz2 and xz streams, read as ``bzip2 -d`` and ``xz -d`` read them.

A bz2 or xz file may hold several streams one after another (``pbzip2`` and
``xz -T`` write them); their data is the data of the file. Python's
``bz2.BZ2File`` and ``lzma.LZMAFile`` stop silently at the first bytes after
a stream that do not start another, so a later stream whose header was
damaged was dropped with all its data. These readers raise there instead.
xz alone allows *stream padding*: zero bytes, a multiple of four, between and
after streams (``LZMAFile`` took them for a stream cut short).

Example:
    >>> import bz2, io
    >>> data = bz2.compress(b"one ") + bz2.compress(b"two")
    >>> open_streams(io.BytesIO(data), "bz2").read()
    b'one two'
"""

from __future__ import annotations

import bz2
import io
import lzma
from typing import Any

__all__ = ["open_streams"]

_BLOCK = 1 << 16


def open_streams(stream: Any, kind: str) -> io.BufferedReader:
    """A binary reader of the data of ``stream``'s ``kind`` (``"bz2"`` or ``"xz"``) streams."""
    reader = _Bz2Streams(stream) if kind == "bz2" else _XzStreams(stream)
    return io.BufferedReader(reader)


class _Streams(io.RawIOBase):
    """The data of the streams of ``stream``, one after another; ``stream`` is not
    closed with it. Subclasses say how a stream is decoded and what lies between two."""

    name = ""  # the format, for errors
    error: type[Exception] = OSError  # the decompressor's error type

    def __init__(self, stream: Any) -> None:
        self._read = stream.read
        self._decoder = self._new_decoder()
        self._carry = b""  # compressed bytes read but not yet given to the decoder
        self._fresh = False  # the decoder has been given nothing yet (a stream after another)
        self._ended = False
        self._finished = 0  # streams read to their end

    def _new_decoder(self) -> Any:
        raise NotImplementedError

    def _skip_between(self, rest: bytes) -> bytes:
        """The bytes that start the next stream (empty at the end), after what may lie
        between two streams; ``rest`` is what the last stream left unread."""
        return rest or self._read(_BLOCK)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        while view and not self._ended:
            decoder = self._decoder
            if decoder.eof:
                self._next_stream(decoder.unused_data)
                continue
            raw = b""
            if decoder.needs_input:
                raw, self._carry = self._carry or self._read(_BLOCK), b""
                if not raw:
                    raise EOFError(
                        "Compressed file ended before the end-of-stream marker was reached"
                    )
            try:
                data = decoder.decompress(raw, len(view))
            except self.error as error:
                if not self._fresh:
                    raise
                raise self.error(
                    f"the bytes after {self.name} stream {self._finished} are not another "
                    f"{self.name} stream ({error}): a damaged stream or trailing data, whose "
                    f"data would be lost; re-create or re-download the file"
                ) from None
            self._fresh = False
            if data:
                view[: len(data)] = data
                return len(data)
        return 0

    def _next_stream(self, rest: bytes) -> None:
        self._finished += 1
        start = self._skip_between(rest)
        if not start:
            self._ended = True
            return
        self._decoder = self._new_decoder()
        self._carry, self._fresh = start, True


class _Bz2Streams(_Streams):
    name = "bz2"
    error = OSError

    def _new_decoder(self) -> Any:
        return bz2.BZ2Decompressor()


class _XzStreams(_Streams):
    """xz (or legacy ``.lzma``) streams, with the stream padding the xz format allows."""

    name = "xz"
    error = lzma.LZMAError

    def _new_decoder(self) -> Any:
        return lzma.LZMADecompressor()

    def _skip_between(self, rest: bytes) -> bytes:
        padding = 0
        while True:
            rest = rest or self._read(_BLOCK)
            start = rest.lstrip(b"\0")
            padding += len(rest) - len(start)
            if start or not rest:
                break
            rest = b""
        if padding % 4:
            raise lzma.LZMAError(
                f"{padding} zero byte(s) after an xz stream: stream padding must be a "
                f"multiple of 4 bytes"
            )
        return start
