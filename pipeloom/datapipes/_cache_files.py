"""Files a cache writes: atomically, under a lock other processes wait on, checked by hash.

* :func:`write_atomically` writes into a temporary file beside the target,
  flushes it to disk and renames it into place: a reader (or a later run)
  sees the whole file or no file, even if the writer is killed midway.
* :class:`FileLock` is an exclusive ``flock`` on ``<dir>/.<name>.lock``: the
  process about to fetch a file holds it, so another process (a worker, a
  second job) waits for the file instead of fetching it again. The wait is
  the kernel's (no polling); a timeout abandons it. The kernel releases the
  lock of a killed process.

Example:
    >>> import os, pathlib, tempfile
    >>> target = os.path.join(tempfile.mkdtemp(), "a.bin")
    >>> write_atomically(target, b"abc", "wb", expected_hash=None, hash_type="sha256")
    >>> pathlib.Path(target).read_bytes()
    b'abc'
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
import weakref
from typing import Any

__all__ = ["FileLock", "file_hash", "write_atomically"]

_CHUNK = 1 << 20


def file_hash(path: str, hash_type: str) -> str:
    """The hex digest of the file at ``path`` (``"sha256"`` or ``"md5"``)."""
    digest = hashlib.new(hash_type)
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_atomically(
    path: str, data: Any, mode: str, *, expected_hash: str | None, hash_type: str
) -> None:
    """Write ``data`` (a stream to copy, or ``bytes``/``str``) to ``path`` in one step.

    Raises:
        RuntimeError: the data's hash is not ``expected_hash`` (nothing is written).
        TypeError: ``data`` does not suit ``mode``.
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.partial-{os.getpid()}-{threading.get_ident()}-{os.urandom(3).hex()}"
    digest = hashlib.new(hash_type) if expected_hash is not None else None
    binary = "b" in mode
    try:
        with open(temporary, "wb" if binary else "w", encoding=None if binary else "utf-8") as file:
            for chunk in _chunks(data, binary, path):
                file.write(chunk)
                if digest is not None:
                    digest.update(chunk if binary else chunk.encode("utf-8"))
            file.flush()
            os.fsync(file.fileno())
        if digest is not None and digest.hexdigest() != expected_hash:
            raise RuntimeError(
                f"the {hash_type} of the data for {path} is {digest.hexdigest()}, expected "
                f"{expected_hash}: the download is corrupt or hash_dict is wrong; nothing was "
                f"written to {path}"
            )
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _chunks(data: Any, binary: bool, path: str):
    kind = bytes if binary else str
    if isinstance(data, (bytes, bytearray, memoryview, str)):
        if not isinstance(data, kind) and not (
            binary and isinstance(data, (bytearray, memoryview))
        ):
            raise TypeError(
                f"end_caching(mode={'wb' if binary else 'w'!r}) got {type(data).__name__} data for "
                f"{path}; use mode={'w' if binary else 'wb'!r} for {type(data).__name__}"
            )
        yield data
        return
    read = getattr(data, "read", None)
    if read is None:
        raise TypeError(
            f"end_caching expects (path, stream) or (path, bytes/str) items, got "
            f"{type(data).__name__} data for {path}"
        )
    try:
        while chunk := read(_CHUNK):
            if not isinstance(chunk, kind):
                raise TypeError(
                    f"the stream for {path} gives {type(chunk).__name__}, but end_caching has a "
                    f"{'binary' if binary else 'text'} mode; use mode={'w' if binary else 'wb'!r}"
                )
            yield chunk
    finally:
        close = getattr(data, "close", None)
        if close is not None:
            close()


class FileLock:
    """An exclusive lock for writing ``path``, shared by every process on the machine.

    Example:
        >>> import os, tempfile
        >>> lock = FileLock(os.path.join(tempfile.mkdtemp(), "x.bin"))
        >>> lock.acquire(timeout=1.0)
        >>> lock.release()
    """

    def __init__(self, path: str) -> None:
        directory, name = os.path.split(path)
        self.lock_path = os.path.join(directory or ".", f".{name}.lock")
        self.target = path
        self._fd = -1

    def acquire(self, timeout: float | None) -> None:
        """Wait (at most ``timeout`` s) until no other process writes ``path``.

        Within this process, a lock held for a pipeline its thread no longer
        runs (the calling thread's own, e.g. an iteration broken off and not
        dropped yet, or an ended thread's) is taken over instead of waited
        for: nothing would ever let it go.

        Raises:
            TimeoutError: another process held it longer than ``timeout``.
        """
        if self._take_over():
            return
        os.makedirs(os.path.dirname(self.lock_path), exist_ok=True)
        while True:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not _wait_for_lock(fd, timeout):
                    raise TimeoutError(
                        f"another process has been writing {self.target} for more than "
                        f"{timeout} s (it holds {self.lock_path}); raise end_caching(timeout=...) "
                        f"or check for a stuck download"
                    ) from None
            if _same_file(fd, self.lock_path):  # not removed by its last holder meanwhile
                self._fd = fd
                with _HELD_GUARD:
                    _HELD[self.lock_path] = (os.getpid(), threading.get_ident(), weakref.ref(self))
                return
            os.close(fd)

    def _take_over(self) -> bool:
        with _HELD_GUARD:
            held = _HELD.get(self.lock_path)
            if held is None or held[0] != os.getpid():
                return False
            holder = held[2]()
            if holder is None or holder._fd < 0 or not _abandoned_by(held[1]):
                return False
            self._fd, holder._fd = holder._fd, -1
            _HELD[self.lock_path] = (held[0], threading.get_ident(), weakref.ref(self))
            return True

    def release(self) -> None:
        """Remove the lock file and let the next waiter in."""
        if self._fd < 0:
            return
        with _HELD_GUARD:
            held = _HELD.get(self.lock_path)
            if held is not None and held[2]() is self:
                del _HELD[self.lock_path]
        try:
            os.unlink(self.lock_path)  # while holding it: a waiter then sees a stale file
        except FileNotFoundError:
            pass
        os.close(self._fd)  # closing releases the flock
        self._fd = -1

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # interpreter shutdown
            pass


_HELD: dict[str, tuple[int, int, weakref.ref[FileLock]]] = {}
"""Locks this process holds: lock file -> (pid, holding thread, lock); a forked
child's copy names its parent's pid and is ignored."""
_HELD_GUARD = threading.Lock()


def _abandoned_by(thread: int | None) -> bool:
    """Whether the thread holding a lock of this process will never let it go by itself."""
    if thread == threading.get_ident():
        return True  # it waits for us: we are that thread
    return all(t.ident != thread for t in threading.enumerate())


def _wait_for_lock(fd: int, timeout: float | None) -> bool:
    """Block in ``flock`` (in a helper thread when there is a timeout); True once held.

    On a timeout the fd is handed to the helper, which closes it (releasing
    the lock) once the kernel finally grants it.
    """
    if timeout is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    granted = threading.Event()
    guard = threading.Lock()
    handoff = {"granted": False, "abandoned": False}

    def take() -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with guard:
            if handoff["abandoned"]:
                os.close(fd)
                return
            handoff["granted"] = True
        granted.set()

    threading.Thread(target=take, name="pipeloom-cache-lock", daemon=True).start()
    if granted.wait(timeout):
        return True
    with guard:
        if handoff["granted"]:
            return True
        handoff["abandoned"] = True
    return False


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False
