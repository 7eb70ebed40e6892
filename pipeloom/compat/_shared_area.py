"""Bytes the main process shares with its worker processes, and may grow while they run.

The plan board keeps each epoch's plan here. An anonymous shared-memory file
(``memfd``): the main process grows it with ``ftruncate`` when a plan needs
more room, and a worker that holds it maps it again at its new size when it
next reads (one ``fstat`` per epoch) -- so persistent workers never have to be
restarted because a plan grew. Pages are allocated as they are written.
"""

from __future__ import annotations

import mmap
import os
import weakref
from multiprocessing.reduction import DupFd
from typing import Any

import numpy as np

from .._shared_memory import anonymous_file

__all__ = ["SharedArea"]

_MIN_SIZE = 64 * 1024


class SharedArea:
    """A growable shared byte area; pickling sends its file descriptor.

    Example:
        >>> area = SharedArea()
        >>> area.ensure(100_000)
        >>> view = area.view()
        >>> view[:3] = [1, 2, 3]
        >>> area.size >= 100_000, bytes(area.view()[:3])
        (True, b'\\x01\\x02\\x03')
    """

    def __init__(self, size: int = _MIN_SIZE, fd: int | None = None) -> None:
        if fd is None:
            fd = anonymous_file(size, "pipeloom-plan")
        self.fd = fd
        weakref.finalize(self, os.close, fd)
        self.size = 0
        self._map: mmap.mmap | None = None
        self._remap()

    def _remap(self) -> None:
        size = os.fstat(self.fd).st_size
        if size != self.size:
            # views of the old mapping stay valid until dropped; it closes with them
            self._map = mmap.mmap(self.fd, size)
            self.size = size

    def ensure(self, size: int) -> None:
        """In the main process: make room for ``size`` bytes (keeping what is there)."""
        if size > self.size:
            os.ftruncate(self.fd, max(size, 2 * self.size))
            self._remap()

    def refresh(self) -> None:
        """In a worker: map the area again if the main process grew it."""
        self._remap()

    def view(self) -> np.ndarray:
        """The whole area as a writable uint8 array."""
        assert self._map is not None
        return np.frombuffer(self._map, dtype=np.uint8)

    def __reduce__(self) -> Any:
        return _rebuild, (DupFd(self.fd),)

    def __repr__(self) -> str:
        return f"SharedArea({self.size} bytes)"


def _rebuild(fd: Any) -> SharedArea:
    return SharedArea(fd=fd.detach())
