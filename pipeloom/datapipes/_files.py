"""Local files: open them (``FileOpener``, ``open_files``); ``_listers`` lists them.

Also the two shared pieces every storage block builds on:

* ``StreamOpener`` — a shardable block turning paths into ``(path, stream)``.
  It closes the streams it handed out on ``reset()``/``close()``, and saves
  those a reader is in the middle of so that a resume re-opens them ("replay"),
  with their version (``_version``): a resume refuses another version of a file.
* ``StreamReader`` — a block that reads each ``(path, stream)`` into items
  (tar members, lines, CSV rows), claims the stream while it reads it, closes it
  when done, and saves how many items of it it emitted (skipped after a replay).

Example:
    >>> import os, tempfile
    >>> from pipeloom.datapipes import FileLister
    >>> root = tempfile.mkdtemp()
    >>> for name in ("b.txt", "a.txt", "c.csv"):
    ...     with open(os.path.join(root, name), "w") as f:
    ...         _ = f.write(name)
    >>> files = FileLister(root, masks="*.txt")
    >>> [os.path.basename(p) for p in files]
    ['a.txt', 'b.txt']
    >>> [(os.path.basename(p), s.read()) for p, s in files.open_files()]
    [('a.txt', 'a.txt'), ('b.txt', 'b.txt')]
"""

from __future__ import annotations

import io
import os
import weakref
from collections.abc import Iterator
from typing import IO, Any

from .._validate import check_index, check_int
from ..errors import StateError
from ._base import IterDataPipe
from ._context import NO_STAMP, current_stamp, restore_stamp, stamp_output
from ._handed_streams import Handed, claim, close_streams, is_claimed, prune, release
from ._pipeline import is_sharding_root
from ._state_fields import StateFields, state_count, state_field

__all__ = ["FileOpener", "StreamOpener", "StreamReader"]

_MODES = {"r": "r", "rt": "r", "t": "r", "rb": "rb", "b": "rb"}


class StreamOpener(IterDataPipe):
    """Base of shardable blocks that open each incoming path; yields ``(path, stream)``.

    Subclasses implement ``_open(path) -> stream`` and ``_check(path)``."""

    inputs = ("source",)
    at_most_one = True  # one stream per kept path: classic workers build batches of them
    _root: bool | None = None

    def __init__(self, source: IterDataPipe) -> None:
        if not isinstance(source, IterDataPipe):
            raise TypeError(
                f"{type(self).__name__} expects an IterDataPipe of paths, got "
                f"{type(source).__name__}; wrap a list with IterableWrapper(paths)"
            )
        self.source = source
        self._total, self._index = 1, 0
        self._position = 0  # items pulled from source this epoch
        self._resume_from = 0  # positions before it are skipped unopened (resume)
        self._handed: Handed = []  # streams given out, maybe open
        # To re-open first after a resume: (position, path) or (position, path, version).
        self._replay: list[tuple] = []
        self._guard: weakref.finalize | None = None
        self._strict = True  # refuse to resume inside another version of a file

    def _open(self, path: str) -> IO[Any]:
        raise NotImplementedError

    def _version(self, stream: IO[Any]) -> str | None:
        """What tells this version of the file ``stream`` reads from another (a local
        file's size and time, a URL's validators); None when nothing can."""
        return None

    def _reopen(self, path: str, version: str | None) -> IO[Any]:
        """Open ``path`` again for a resume inside it: refuse another version of the file."""
        stream = self._open(path)
        if self._strict and version is not None and (now := self._version(stream)) != version:
            stream.close()
            raise StateError(
                f"{self!r}: {path!r} changed since the checkpoint was saved ({version}; "
                f"now {now}), so resuming inside it would skip the saved number of items of "
                f"another version of the file and read the rest of that. Restore the file as "
                f"it was, or start the epoch over without loading the state"
            )
        return stream

    def _check(self, path: Any) -> str:
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if not isinstance(path, str):
            raise TypeError(
                f"{type(self).__name__} expects paths (str), got {type(path).__name__} "
                f"{path!r}; put it after a block that yields paths, e.g. FileLister"
            )
        return path

    def is_shardable(self) -> bool:
        return True

    def sharding_settings(self, total: int, index: int) -> None:
        check_int("total", total, minimum=1)
        check_index("index", index, total)
        self._total, self._index = total, index

    def async_next(self) -> tuple[str, IO[Any]]:
        if self._replay:
            position, path, *version = self._replay[0]
            stream = self._reopen(path, version[0] if version else None)
            del self._replay[0]
        else:
            while True:
                raw = self.source.async_next()
                position = self._position
                self._position = position + 1
                if position >= self._resume_from and position % self._total == self._index:
                    break
            path = self._check(raw)
            stream = self._open(path)
        self._track(position, path, stream)
        if self._root is None:
            self._root = is_sharding_root(self)
        if self._root:  # below a sharding_filter: keep its positions
            self._stamp_item(position)
        return path, stream

    def _track(self, position: int, path: str, stream: IO[Any]) -> None:
        handed = self._handed
        prune(handed)
        handed.append((position, path, stream))
        if self._guard is None:
            # Closes the streams when this block is collected. A finalizer runs
            # before the garbage's own finalizers, even inside a reference
            # cycle, so the files never warn "unclosed file".
            self._guard = weakref.finalize(self, close_streams, handed)

    def close(self) -> None:
        """Close every stream this block handed out that is still open."""
        close_streams(self._handed)

    def reset(self) -> None:
        self.close()
        self._position = 0
        self._resume_from = 0
        self._replay = []
        self._root: bool | None = None  # decided at the first item of the epoch

    def set_strict_resume(self, strict: bool) -> None:
        """``False``: resume inside a file that changed (``load_state_dict(strict=False)``)."""
        self._strict = strict

    def resume_at(self, position: int) -> None:
        """Skip the paths before ``position`` without opening them."""
        self._resume_from = position

    def __len__(self) -> int:
        size = len(self.source)
        return max(0, -(-(size - self._index) // self._total))

    def state_dict(self) -> dict[str, Any]:
        reading = [
            (p, path) if (version := self._version(s)) is None else (p, path, version)
            for p, path, s in self._handed
            if not s.closed and is_claimed(s)
        ]
        return {"position": self._position, "replay": self._replay + reading}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        position = state_count(self, state, "position")
        replay = state_field(self, state, "replay")
        if not isinstance(replay, (list, tuple)) or not all(
            isinstance(entry, (list, tuple))
            and len(entry) in (2, 3)
            and isinstance(entry[0], int)
            and not isinstance(entry[0], bool)
            and 0 <= entry[0] < position
            and all(isinstance(text, str) for text in entry[1:])
            for entry in replay
        ):
            raise StateError(
                f"{self!r}: state field 'replay' must be a list of (position, path) or "
                f"(position, path, version) with 0 <= position < {position}, got {replay!r:.100}"
            )
        self.close()
        self._position = position
        self._replay = [tuple(entry) for entry in replay]

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()  # a copy re-opens what this one has open
        state["_replay"] = self.state_dict()["replay"]
        state["_handed"] = []
        state["_guard"] = None
        return state


class FileOpener(StreamOpener):
    """Open each local path; yield ``(path, stream)``. Functional: ``open_files``.

    Streams are closed by the block that reads them to the end (tar, lines,
    CSV), and any still open are closed on ``reset()``, ``close()`` or when the
    block is garbage collected. Shardable: with ``sharding_settings(n, i)``
    it opens only the paths at positions ``p % n == i``.

    Args:
        source: a block yielding paths.
        mode: ``"r"`` (text) or ``"rb"`` (binary).
        encoding: text encoding (text mode only).
    """

    def __init__(self, source: IterDataPipe, mode: str = "r", encoding: str | None = None) -> None:
        super().__init__(source)
        if mode not in _MODES:
            raise ValueError(f"mode must be one of 'r', 'rt', 'rb', 't', 'b', got {mode!r}")
        self.mode = _MODES[mode]
        if encoding is not None and self.mode == "rb":
            raise ValueError(f"encoding={encoding!r} needs a text mode; use mode='r'")
        self.encoding = encoding

    def _open(self, path: str) -> IO[Any]:
        return open(path, self.mode, encoding=self.encoding)  # noqa: SIM115

    def _version(self, stream: IO[Any]) -> str | None:
        try:
            status = os.fstat(stream.fileno())  # the file it opened, even if renamed over since
        except (OSError, ValueError, AttributeError):  # not a file (a subclass's own stream)
            return None
        return f"{status.st_size} bytes, modified {status.st_mtime_ns} ns"

    def __repr__(self) -> str:
        return f"FileOpener(mode={self.mode!r}, encoding={self.encoding!r})"


class StreamReader(IterDataPipe):
    """Base of blocks reading each ``(path, stream)`` into several items.

    Subclasses implement ``_read(path, stream, skip)``: a generator of the
    output items of one stream, not yielding its first ``skip`` items.
    """

    per_item = True  # each opened stream is read on its own: runs in workers

    inputs = ("source",)

    def __init__(self, source: IterDataPipe) -> None:
        if not isinstance(source, IterDataPipe):
            raise TypeError(
                f"{type(self).__name__} expects an IterDataPipe of (path, stream), got "
                f"{type(source).__name__}; build one with FileLister(...).open_files()"
            )
        self.source = source
        self._reader: Iterator[Any] | None = None
        self._stream: IO[Any] | None = None
        self._count = 0  # items of the current stream emitted (incl. skipped)
        self._skip = 0  # items to skip in the next stream (after a resume)
        self._stamp: tuple = NO_STAMP  # the current stream's (its outputs: (*key, j))
        self._resume_stamp: tuple | None = None  # the stream a resume reads first
        # A (path, bytes) input: no opener replays it, so a checkpoint keeps it.
        self._bytes: tuple[str, bytes] | None = None
        self._replay_bytes: tuple[str, bytes] | None = None

    def _read(self, path: str, stream: IO[Any], skip: int) -> Iterator[Any]:
        raise NotImplementedError

    def async_next(self) -> Any:
        while True:
            if self._reader is None:
                item: Any = self._replay_bytes
                if item is not None:
                    self._replay_bytes = None
                else:
                    item = self.source.async_next()
                self._bytes = None
                if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], bytes):
                    self._bytes = item
                    item = (item[0], io.BytesIO(item[1]))  # e.g. a tar member, read like a file
                if not (isinstance(item, tuple) and len(item) == 2 and hasattr(item[1], "read")):
                    raise TypeError(
                        f"{self!r} expects (path, stream) items, got {type(item).__name__}; "
                        f"put it after open_files() / an HTTP or fsspec opener"
                    )
                self._stream = item[1]
                claim(item[1])
                self._count = self._skip
                self._reader = self._read(str(item[0]), item[1], self._skip)
                self._skip = 0
                if self._resume_stamp is not None:  # the stream replayed first by a resume
                    self._stamp, self._resume_stamp = self._resume_stamp, None
                else:
                    self._stamp = current_stamp()
            else:  # the reader's parent may have stamped another item since
                restore_stamp(self._stamp)
            try:
                out = next(self._reader)
            except StopIteration:
                self._finish()
                continue
            except BaseException:
                self._finish()
                raise
            count = self._count
            self._count = count + 1
            stamp_output(self._stamp, count)  # type: ignore[arg-type]
            return out

    def _finish(self) -> None:
        reader, stream = self._reader, self._stream
        self._reader = self._stream = None
        self._count = 0
        if reader is not None:
            reader.close()  # type: ignore[attr-defined]
        if stream is not None:
            release(stream)
            stream.close()

    def reset(self) -> None:
        self._finish()
        self._skip = 0
        self._resume_stamp = None
        self._replay_bytes = None

    def state_dict(self) -> dict[str, Any]:
        if self._reader is not None:
            extra = {} if self._bytes is None else {"input": self._bytes}
            return {"skip": self._count, "stamp": self._stamp, **extra}
        if self._skip and self._resume_stamp is not None:
            return {"skip": self._skip, "stamp": self._resume_stamp}
        return {"skip": self._skip}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        skip = state_count(self, state, "skip")
        stamp = None
        if skip and state.get("stamp") is not None:
            stamp = StateFields(self, state).stamp("stamp")
        replay = state.get("input")
        if replay is not None and not (
            isinstance(replay, (tuple, list)) and len(replay) == 2 and isinstance(replay[1], bytes)
        ):
            StateFields(self, state).fail("input", "a (path, bytes) pair", replay)
        self._finish()
        self._skip = skip
        self._resume_stamp = stamp
        self._replay_bytes = None if replay is None else (replay[0], replay[1])

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_reader"] = state["_stream"] = None
        state["_skip"] = self.state_dict()["skip"]
        state["_count"] = 0
        return state
