"""The streams an opener handed out: which a reader is in the middle of, which are dropped.

An opener (``open_files``, ``HttpReader``, ...) hands out ``(path, stream)``.
A reader of several items per stream (``load_from_tar``, ``readlines``, ...)
claims the stream while it reads it and closes it at its end; a resume must
re-open a claimed stream and skip what the reader emitted. A stream nobody
claimed went to one-to-one code (``.map(lambda x: x[1].read())``, a decoder):
its item was made, even if the stream was left open, and re-opening it on
resume would make that item a second time.

A claim reaches the streams under a wrapper (a decompressor's ``wrapped_stream``,
a buffer's ``raw``, a text stream's ``buffer``), so the opener's own stream is
claimed when a reader reads it through ``decompress()``.

The opener keeps the streams it handed out to close them on ``reset()``, and
closes one as soon as nothing else holds it (one-to-one code that read it
and let it go): an epoch over a million files keeps only the streams in use
open, not every file it read.
"""

from __future__ import annotations

import sys
import weakref
from typing import IO, Any

__all__ = ["claim", "close_streams", "is_claimed", "prune", "release"]

Handed = list[tuple[int, str, IO[Any]]]  # (position, path, stream)
_ONLY_OURS = 2  # sys.getrefcount of a stream held only by its entry in the list

_CLAIMED: weakref.WeakSet[Any] = weakref.WeakSet()
_HELD: dict[int, Any] = {}  # streams without weak references, until released
_UNDER = ("wrapped_stream", "raw", "buffer")


def _chain(stream: Any) -> list[Any]:
    chain: list[Any] = []
    while stream is not None and len(chain) < 8:
        chain.append(stream)
        under = [getattr(stream, name) for name in _UNDER if hasattr(stream, name)]
        stream = under[0] if under else None
    return chain


def claim(stream: Any) -> None:
    """Note that a reader is reading ``stream`` (and the streams under it) item by item."""
    for part in _chain(stream):
        try:
            _CLAIMED.add(part)
        except TypeError:  # no weak references: held until released
            _HELD[id(part)] = part


def release(stream: Any) -> None:
    """The reader is done with ``stream`` (read to its end, or dropped)."""
    for part in _chain(stream):
        try:
            _CLAIMED.discard(part)
        except TypeError:
            _HELD.pop(id(part), None)


def is_claimed(stream: Any) -> bool:
    """True while a reader is in the middle of ``stream``."""
    try:
        return stream in _CLAIMED
    except TypeError:
        return _HELD.get(id(stream)) is stream


def prune(handed: Handed) -> None:
    """Forget the closed streams of ``handed``; close those nothing else holds any more."""
    kept = []
    for entry in handed:
        stream = entry[2]
        if stream.closed:
            continue
        if sys.getrefcount(stream) <= _ONLY_OURS + 1:  # + the loop's own name
            stream.close()  # unreachable but through us: read and let go
            continue
        kept.append(entry)
    handed[:] = kept


def close_streams(handed: Handed) -> None:
    """Close every stream of ``handed`` and forget them."""
    streams = [entry[2] for entry in handed]
    handed.clear()
    for stream in streams:
        stream.close()
