"""Shared-memory segments: creation, the producer's pool, the consumer's mappings.

Segments are anonymous: ``os.memfd_create`` on Linux, so nothing ever appears
in ``/dev/shm`` and the kernel frees a segment when the last process holding
its file descriptor or a mapping of it lets go -- even after ``SIGKILL``.
Elsewhere a POSIX shared-memory object is created and unlinked at once (its
name exists for microseconds); descriptors travel between processes with
``SCM_RIGHTS``, so nobody ever attaches by name.

The producer pools segments by power-of-two size class and reuses one only
after the consumer reported it free; it keeps a few free segments in all (of
any sizes), retiring the least recently freed, so items whose sizes vary keep
no more than items of the largest size would. Memory of a memfd is allocated
lazily, so rounding a size up costs address space, not RAM.

A producer may also *allocate* a segment to build an item in (a batch
collated straight into shared memory): the segment stays in use while the
producer's array over it lives and while any message that refers to it is
with the consumer, so it is reused only once both let go.
"""

from __future__ import annotations

import collections
import itertools
import mmap
import os
import weakref
from dataclasses import dataclass, field

import numpy as np

from .._shared_memory import anonymous_file

__all__ = ["MIN_SEGMENT", "MappingCache", "Segment", "SegmentPool", "new_segment_fd"]

MIN_SEGMENT = 64 * 1024


def new_segment_fd(size: int) -> int:
    """Create an anonymous shared-memory file of ``size`` bytes; return its fd."""
    return anonymous_file(size, "pipeloom-queue")


def size_class(nbytes: int) -> int:
    """Round ``nbytes`` up to the pool's size class (a power of two)."""
    return max(MIN_SEGMENT, 1 << (max(nbytes, 1) - 1).bit_length())


@dataclass(eq=False)
class Segment:
    """One producer-side segment: its id, fd, size and writable mapping.

    ``users`` counts what holds it: each message with the consumer that refers
    to it, and the producer's own array over it while one lives.
    ``announced``: the consumer has its descriptor (it was sent once).
    """

    id: int
    fd: int
    size: int
    mapping: mmap.mmap
    view: memoryview = field(init=False)
    users: int = 0
    announced: bool = False

    def __post_init__(self) -> None:
        self.view = memoryview(self.mapping)

    def close(self) -> None:
        self.view.release()
        try:
            self.mapping.close()
        except BufferError:  # a PickleBuffer still borrows it; the GC unmaps it later
            pass
        os.close(self.fd)


class SegmentPool:
    """The producer's segments, free or lent to the consumer.

    Args:
        max_free: free segments kept, of all sizes together; past it the least
            recently freed one is retired.
        max_free_bytes: free bytes kept in all; a segment that would exceed it
            is retired (None: no limit beyond ``max_free``).
    """

    def __init__(self, max_free: int, max_free_bytes: int | None = None) -> None:
        self._max_free = max_free
        self._max_free_bytes = max_free_bytes
        self._free_bytes = 0
        self._ids = itertools.count(1)
        self._free: dict[int, Segment] = {}  # by id, least recently freed first
        self._lent: dict[int, Segment] = {}
        self._lent_bytes = 0
        # Segments the producer builds items in: (start address, end, segment) by id,
        # and the ids whose producer-side array died (appended by a finalizer, from
        # any thread, and handled by :meth:`collect_dropped`).
        self._writable: dict[int, tuple[int, int, Segment]] = {}
        self._dropped: collections.deque[int] = collections.deque()
        self.created = 0
        self.reused = 0

    def acquire(self, nbytes: int) -> Segment:
        """A segment of at least ``nbytes``, with one user (the caller)."""
        size = size_class(nbytes)
        # the most recently freed one of its size is warmest (a few entries: max_free)
        segment = next((s for s in reversed(self._free.values()) if s.size == size), None)
        if segment is not None:
            del self._free[segment.id]
            self._free_bytes -= segment.size
            self.reused += 1
        else:
            fd = new_segment_fd(size)
            try:
                segment = Segment(next(self._ids), fd, size, mmap.mmap(fd, size))
            except BaseException:
                os.close(fd)
                raise
            self.created += 1
        segment.users = 1
        self._lent[segment.id] = segment
        self._lent_bytes += segment.size
        return segment

    def allocate(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of a segment as a writable uint8 array, to build an item in.

        The segment is reused only after this array (and every view of it) is
        gone and the consumer freed every message that referred to it.
        """
        segment = self.acquire(nbytes)
        array = np.frombuffer(segment.mapping, np.uint8, nbytes, 0)
        start = array.__array_interface__["data"][0]
        self._writable[segment.id] = (start, start + segment.size, segment)
        finalizer = weakref.finalize(array, self._dropped.append, segment.id)
        finalizer.atexit = False
        return array

    def locate(self, buffer: memoryview) -> tuple[Segment, int] | None:
        """The allocated segment holding ``buffer`` and its offset there, or None."""
        if not self._writable or not buffer.nbytes:
            return None
        address = np.frombuffer(buffer, np.uint8).__array_interface__["data"][0]
        for start, end, segment in self._writable.values():
            if start <= address and address + buffer.nbytes <= end:
                return segment, address - start
        return None

    def lend(self, segment: Segment) -> None:
        """One more user: a message that refers to ``segment`` went to the consumer."""
        segment.users += 1

    def collect_dropped(self) -> list[int]:
        """Release segments whose producer-side array died; the ids retired."""
        retired = []
        while self._dropped:
            segment_id = self._dropped.popleft()
            if self._writable.pop(segment_id, None) is not None:
                gone = self.release(segment_id)
                if gone is not None:
                    retired.append(gone)
        return retired

    @property
    def held_bytes(self) -> int:
        """Bytes of the segments it holds, lent to the consumer or free."""
        return self._lent_bytes + self._free_bytes

    def release(self, segment_id: int) -> int | None:
        """One user fewer; at none, the segment is pooled, or retired (its id returned).

        Pooling it when ``max_free`` segments are free already retires the least
        recently freed one (that id is returned).
        """
        segment = self._lent.get(segment_id)
        if segment is None:
            return None
        segment.users -= 1
        if segment.users > 0:
            return None
        del self._lent[segment_id]
        self._lent_bytes -= segment.size
        free = self._free
        oldest = next(iter(free.values())) if len(free) >= self._max_free and free else None
        budget = self._max_free_bytes
        kept = self._free_bytes - (0 if oldest is None else oldest.size)
        if self._max_free < 1 or (budget is not None and kept + segment.size > budget):
            segment.close()
            return segment_id
        free[segment_id] = segment
        self._free_bytes += segment.size
        if oldest is None:
            return None
        self._retire_free(oldest)
        return oldest.id

    def _retire_free(self, segment: Segment) -> None:
        del self._free[segment.id]
        self._free_bytes -= segment.size
        # Free its memory now, not when the consumer reads the RETIRE and unmaps it
        # (maybe much later): nothing of it is in use there.
        os.ftruncate(segment.fd, 0)
        segment.close()

    def trim(self, min_size: int) -> list[int]:
        """Retire the free segments of ``min_size`` bytes or more; their ids."""
        retired = [segment for segment in self._free.values() if segment.size >= min_size]
        for segment in retired:
            self._retire_free(segment)
        return [segment.id for segment in retired]

    def discard(self, segment: Segment) -> None:
        """Drop a segment that was acquired but never sent."""
        if self._lent.pop(segment.id, None) is not None:
            self._lent_bytes -= segment.size
        self._writable.pop(segment.id, None)
        segment.close()

    def close(self) -> None:
        """Close every segment; consumers' mappings keep their data alive."""
        for segment in self._free.values():
            segment.close()
        for segment in self._lent.values():
            segment.close()
        self._free.clear()
        self._lent.clear()
        self._writable.clear()
        self._free_bytes = self._lent_bytes = 0


class MappingCache:
    """The consumer's read-write mappings of the producer's segments, by id.

    A segment is mapped when a message first uses it, and the mapping reused for
    every later message in it. Its descriptor is kept until then: a mapping the
    system refused (no memory) is tried again by the next message using the
    segment, and a message's descriptors are always taken off the socket's
    queue with it, whatever fails (the next message must not get them).
    Arrays built over a mapping keep it alive after it leaves the cache.
    """

    def __init__(self) -> None:
        self._maps: dict[int, mmap.mmap] = {}
        self._fds: dict[int, tuple[int, int]] = {}  # not mapped yet: id -> (fd, size)

    def add(self, segment_id: int, fd: int, size: int) -> None:
        """Take over a new segment's descriptor; it is mapped when first used."""
        self._fds[segment_id] = (fd, size)

    def get(self, segment_id: int) -> mmap.mmap:
        """The segment's mapping. Raises ``OSError`` if the system refuses it (kept for a retry)."""
        mapping = self._maps.get(segment_id)
        if mapping is not None:
            return mapping
        try:
            fd, size = self._fds[segment_id]
        except KeyError:
            raise RuntimeError(
                f"protocol error: message refers to unknown shared-memory segment {segment_id}"
            ) from None
        mapping = mmap.mmap(fd, size)
        del self._fds[segment_id]
        os.close(fd)
        self._maps[segment_id] = mapping
        return mapping

    def retire(self, segment_id: int) -> None:
        self._maps.pop(segment_id, None)
        pending = self._fds.pop(segment_id, None)
        if pending is not None:
            os.close(pending[0])

    def __len__(self) -> int:
        return len(self._maps) + len(self._fds)

    def close(self) -> None:
        self._maps.clear()  # mappings still borrowed by arrays are unmapped by the GC
        while self._fds:
            os.close(self._fds.popitem()[1][0])
