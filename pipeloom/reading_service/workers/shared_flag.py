"""A flag the main process sets and a worker process reads, with no name anywhere.

``multiprocessing.Event`` would do, but under spawn and forkserver it is a
named semaphore in ``/dev/shm`` that lives until the Event is freed (and a
resource tracker to clean up after it). A :class:`SharedFlag` is one byte of
an anonymous shared file (``memfd`` on Linux, an unlinked temporary file
elsewhere): its descriptor travels with the worker's arguments, reading it
costs a memory load, and the kernel frees it with the last process holding it.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from multiprocessing.reduction import DupFd
from typing import Any

__all__ = ["SharedFlag"]


class SharedFlag:
    """A boolean shared by a process and the workers it passes the flag to.

    Example:
        >>> flag = SharedFlag()
        >>> flag.is_set()
        False
        >>> flag.set(); flag.is_set()
        True
        >>> flag.clear(); flag.close()
    """

    def __init__(self, fd: int | None = None) -> None:
        self._fd = _anonymous_page() if fd is None else fd
        self._map: mmap.mmap | None = mmap.mmap(self._fd, mmap.PAGESIZE)

    def set(self) -> None:
        self._page()[0] = 1

    def clear(self) -> None:
        self._page()[0] = 0

    def is_set(self) -> bool:
        return self._page()[0] == 1

    def _page(self) -> mmap.mmap:
        if self._map is None:
            raise RuntimeError(
                "this SharedFlag was closed; a pool makes new flags when it restarts"
            )
        return self._map

    def close(self) -> None:
        """Release the mapping and the descriptor; idempotent."""
        if self._map is not None:
            self._map.close()
            self._map = None
            os.close(self._fd)

    def __reduce__(self) -> Any:
        # Sent as a Process argument (spawn, forkserver): the descriptor is duplicated
        # into the child (fork children inherit the object itself, unpickled).
        return _rebuild, (DupFd(self._fd),)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _rebuild(fd: Any) -> SharedFlag:
    return SharedFlag(fd.detach())


def _anonymous_page() -> int:
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("pipeloom-flag", os.MFD_CLOEXEC)
    else:  # pragma: no cover - non-Linux
        with tempfile.TemporaryFile() as file:
            fd = os.dup(file.fileno())
    try:
        os.ftruncate(fd, mmap.PAGESIZE)
    except BaseException:
        os.close(fd)
        raise
    return fd
