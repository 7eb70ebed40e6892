"""The control block both processes of a ProcessQueue map: counters and claims.

One page of anonymous shared memory holding 64-bit slots. Each counter has a
single writer (``PUTS`` the producer, ``GETS`` the consumer), so reading it
from the other side needs no lock. Flow control is exact and costs no system
call in the common case: the producer may put while ``PUTS - GETS <
capacity``. When it must wait it raises ``WAITING``, and the consumer, after
bumping ``GETS``, sends one wake-up frame if it sees the flag (an eventcount;
:meth:`Control.fence` orders each side's store before its load, so no wake-up is lost).

Claims (which process holds which end) are taken under ``lockf`` on the
block, so two processes racing to become the producer cannot both win.
"""

from __future__ import annotations

import fcntl
import mmap
import os

from pipeloom._shared_memory import memory_fence
from pipeloom.queues._shm import new_segment_fd

__all__ = ["Control", "Slot"]


class Slot:
    PUTS = 0
    GETS = 1
    WAITING = 2
    PRODUCER_PID = 3
    CONSUMER_PID = 4
    PRODUCER_CLOSED = 5
    CONSUMER_CLOSED = 6
    BYTES_VIA_SHM = 7
    SEGMENTS_CREATED = 8
    SEGMENTS_REUSED = 9
    BYTES_INLINE = 10
    SHM_BYTES_HELD = 11
    BYTES_UNCOPIED = 12


class Control:
    """A mapped control block; ``fd`` is what travels to other processes."""

    SIZE = mmap.PAGESIZE

    def __init__(self, fd: int | None = None) -> None:
        self.fd = new_segment_fd(self.SIZE) if fd is None else fd
        self._map = mmap.mmap(self.fd, self.SIZE)
        self.slots = memoryview(self._map).cast("q")

    def fence(self) -> None:
        """A full memory barrier (:func:`~pipeloom._shared_memory.memory_fence`)."""
        memory_fence()

    def __getitem__(self, slot: int) -> int:
        return self.slots[slot]

    def __setitem__(self, slot: int, value: int) -> None:
        self.slots[slot] = value

    def claim(self, slot: int, pid: int) -> int:
        """Write ``pid`` into ``slot`` unless another pid holds it; return the holder."""
        fcntl.lockf(self.fd, fcntl.LOCK_EX)
        try:
            holder = self.slots[slot]
            if holder == 0:
                self.slots[slot] = holder = pid
            return holder
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self.slots.release()
        self._map.close()
        os.close(self.fd)
