"""Memory shared between processes: anonymous files, and a barrier for lock-free slots.

An anonymous file (``memfd`` on Linux; elsewhere a POSIX shared-memory object
unlinked at once) never appears in ``/dev/shm`` under a name, and the kernel
frees it when the last process holding its descriptor or a mapping lets go,
even after ``SIGKILL``. Descriptors travel with ``SCM_RIGHTS``.

Example:
    >>> import mmap, os
    >>> fd = anonymous_file(4096, "pipeloom-example")
    >>> with mmap.mmap(fd, 4096) as view:
    ...     view[:2] = b"ok"
    ...     memory_fence()  # the bytes are stored before what is written next
    ...     bytes(view[:2])
    b'ok'
    >>> os.close(fd)
"""

from __future__ import annotations

import os
import threading

__all__ = ["anonymous_file", "memory_fence"]

_FENCE = threading.Lock()


def anonymous_file(size: int, name: str) -> int:
    """Create an anonymous shared-memory file of ``size`` bytes; return its descriptor.

    ``name`` shows in ``/proc/<pid>/fd`` (Linux) for whoever looks for a leak.
    """
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
    else:  # pragma: no cover - non-Linux fallback
        fd = _posix_shm_fd()
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _posix_shm_fd() -> int:  # pragma: no cover - exercised only without memfd
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(create=True, size=1)
    try:
        return os.dup(shm._fd)  # type: ignore[attr-defined]  # noqa: SLF001 - the only handle
    finally:
        shm.close()
        shm.unlink()  # no name survives, so no segment can leak


def memory_fence() -> None:
    """A full memory barrier: a lock round trip is an atomic read-modify-write.

    Orders a store to shared memory before a later load (or store) in this
    thread, as a slot's writer and its reader in another process need.
    """
    _FENCE.acquire()
    _FENCE.release()
