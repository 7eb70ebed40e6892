"""The receiving half of a ProcessQueue, as used inside the consumer process."""

from __future__ import annotations

import collections
import os
import socket
import struct
import weakref
from array import array
from typing import Any

import numpy as np

from pipeloom.queues._base import Deadline, QueueBroken, QueueClosed
from pipeloom.queues._control import Control, Slot
from pipeloom.queues._peer import (
    FdSetReadiness,
    describe_exit,
    is_readable,
    open_pidfd,
    wait_readable,
)
from pipeloom.queues._producer import SHM_META, STREAM_IN_SHM
from pipeloom.queues._serialize import decode
from pipeloom.queues._shm import MappingCache
from pipeloom.queues._wire import Inbox, Kind, send_frame

__all__ = ["EMPTY", "ConsumerEnd"]

EMPTY = object()
_MAPPED = -1  # a pending SHM_ITEM whose segments are mapped: (stream, buffers)
_ITEM, _SHM_ITEM, _GETS = Kind.ITEM, Kind.SHM_ITEM, Slot.GETS


class ConsumerEnd:
    """Receives items, maps segments, reports frees; one per consumer process."""

    def __init__(self, sock: socket.socket, ctl: Control, capacity: int, wake_fd: int) -> None:
        self._sock = sock
        self._ctl = ctl
        self._wake_at = capacity // 2
        self._inbox = Inbox()
        self._maps = MappingCache()
        self._frees: collections.deque[int] = collections.deque()
        self._producer_pid: int | None = None
        self._producer_pidfd: int | None = None
        self._problem: Exception | None = None
        self._pending: tuple | None = None  # an item taken off the socket, not returned yet
        self._interrupted_in: str | None = None  # a change of state an interrupt would tear
        self.closed_here: str | None = None
        self.on_peer = lambda pid: None
        self.readiness = FdSetReadiness([sock.fileno(), wake_fd])
        self._fds = [sock.fileno(), wake_fd]
        send_frame(sock, Kind.HELLO, struct.pack("<q", os.getpid()))

    def get(self, block: bool, deadline: Deadline) -> Any:
        ready: list[int] = []
        while True:
            item = self.try_get(check_peer=not block or self._producer_pidfd in ready)
            if item is not EMPTY:
                return item
            if not block:
                return EMPTY
            if deadline.expired():  # checked after each try: a wake-up is not an item
                raise TimeoutError(
                    f"ProcessQueue.get() timed out after {deadline.timeout}s: no item arrived"
                )
            ready = wait_readable(self._fds, deadline.remaining())

    def try_get(self, check_peer: bool = True) -> Any:
        """The next item, or EMPTY; raises QueueError once closed/broken and drained.

        ``check_peer=False`` skips asking the producer's pidfd (a blocking
        caller polls it anyway), saving a system call per empty read.

        Ctrl-C (``KeyboardInterrupt``, or any exception a signal handler
        raises) may cut it short anywhere: the item being unpickled stays
        pending and the next call returns it; the socket's bytes are never
        lost (see :meth:`Inbox.fill`). Where the state could be half changed
        (mapping an item's segments, handling a control frame) the queue is
        marked broken instead: never a wrong item.
        """
        if self.closed_here is not None:
            raise QueueClosed(self.closed_here)
        if self._problem is not None:
            raise self._problem
        if self._pending is not None:
            return self._deliver()
        if self._frees:
            self._send_frees()
        inbox = self._inbox
        while True:
            frame = inbox.peek()
            if frame is None:
                if self._fill():
                    continue
                self._wake_producer_if_waiting()  # never sleep while the producer does
                if not inbox.eof and not (check_peer and self._producer_died()):
                    return EMPTY
                if self._fill():  # what the producer wrote before dying
                    continue
                self._problem = self._gone()
                raise self._problem
            kind, body, after = frame
            if kind == _ITEM or kind == _SHM_ITEM:
                # Pending first, then taken and counted by _deliver, idempotently: an
                # interrupt anywhere in between leaves it to the next call to finish.
                self._pending = (kind, body, after, self._ctl.slots[_GETS] + 1)
                return self._deliver()
            self._interrupted_in = "handling a control frame"
            self._handle_control(kind, body)
            inbox.take(after)
            self._interrupted_in = None

    def get_interrupted(self, error: BaseException) -> None:
        """Called with an exception that left :meth:`try_get`: if it cut a change of
        state short, the queue cannot be read any further."""
        where = self._interrupted_in
        if where is None or self._problem is not None:
            return
        self._problem = QueueBroken(
            f"ProcessQueue: get() was interrupted ({type(error).__name__}) while {where}, "
            "so the stream may be torn mid-message; expected an interrupt while waiting or "
            "unpickling, which get() resumes exactly. Nothing more can be read from this "
            "queue: make a new one (restart the loader's iterator)"
        )

    def _deliver(self) -> Any:
        """Take, count and decode the pending item; an interrupt leaves it pending."""
        kind, payload, after, gets = self._pending  # type: ignore[misc]
        self._inbox.take(after)  # (no read of the socket happens while an item is pending)
        slots = self._ctl.slots
        if slots[_GETS] != gets:
            slots[_GETS] = gets
            self._after_got(gets)
        if kind == _ITEM:
            stream, buffers = payload, []
        else:
            if kind == _SHM_ITEM:
                self._interrupted_in = "mapping the shared memory of an item"
                try:
                    payload = self._map_shm(payload)
                except Exception:
                    self._pending = None
                    self._interrupted_in = None
                    raise
                self._pending = (_MAPPED, payload, after, gets)
                self._interrupted_in = None
            stream, buffers = payload
        try:
            item = self._decode(stream, buffers)
        except Exception:
            self._pending = None  # consumed, as documented: it raised, not an interrupt
            del payload, stream, buffers
            raise
        self._pending = None
        return item

    def _producer_died(self) -> bool:
        return self._producer_pidfd is not None and is_readable(self._producer_pidfd)

    def _fill(self) -> bool:
        try:
            return self._inbox.fill(self._sock)
        except OSError as err:
            self._problem = QueueBroken(f"{describe_exit('producer', self._producer_pid)} ({err})")
            raise self._problem from err

    def _handle_control(self, kind: int, body: bytes) -> None:
        if kind == Kind.HELLO:
            (pid,) = struct.unpack("<q", body)
            if pid != os.getpid():
                self._producer_pid = pid
                self._producer_pidfd = open_pidfd(pid)
                if self._producer_pidfd is not None:
                    self._fds.append(self._producer_pidfd)
                    self.readiness.add_fd(self._producer_pidfd)
                self.on_peer(pid)
        elif kind == Kind.ANNOUNCE:  # descriptors of segments the next message refers to
            pairs = array("Q", body)
            for index in range(0, len(pairs), 2):
                self._maps.add(pairs[index], self._inbox.fds.popleft(), pairs[index + 1])
        elif kind == Kind.RETIRE:
            for segment_id in array("I", body):
                self._maps.retire(segment_id)
        elif kind == Kind.CLOSE:
            who = f"producer process {self._producer_pid}" if self._producer_pid else "producer"
            self._problem = QueueClosed(f"the {who} closed the queue (all its items were got)")
            raise self._problem

    def _gone(self) -> Exception:
        if self._inbox.holds_part_of_a_frame():
            return QueueBroken(
                f"{describe_exit('producer', self._producer_pid)} in the middle of a message "
                "(its put() was cut short); the items before it were got"
            )
        if self._ctl[Slot.PRODUCER_CLOSED]:
            return QueueClosed("the producer closed the queue (all its items were got)")
        return QueueBroken(describe_exit("producer", self._producer_pid))

    def _after_got(self, gets: int) -> None:
        ctl = self._ctl
        ctl.fence()
        # Wake a producer waiting for room once half the queue is free (or, in
        # try_get, before this end goes to sleep): fewer wake-ups, same bound.
        if ctl[Slot.WAITING] and ctl[Slot.PUTS] - gets <= self._wake_at:
            self._send_wake()

    def _wake_producer_if_waiting(self) -> None:
        self._ctl.fence()
        if self._ctl[Slot.WAITING]:
            self._send_wake()

    def _send_wake(self) -> None:
        self._ctl[Slot.WAITING] = 0
        try:
            send_frame(self._sock, Kind.WAKE)
        except OSError:
            pass  # the producer is gone; the next read reports it

    def _decode(self, stream: Any, buffers: list[memoryview]) -> Any:
        try:
            return decode(stream, buffers)
        except Exception as err:
            err.add_note(
                "pipeloom: raised while unpickling an item received from a ProcessQueue; "
                "the item was consumed (can the consumer import everything the item refers to?)"
            )
            raise

    def _map_shm(self, body: bytes) -> tuple[Any, list[memoryview]]:
        """The pickle stream and buffers of an SHM_ITEM, as views of mapped segments."""
        nsegments, count, flags = SHM_META.unpack_from(body)
        at = SHM_META.size
        segments = array("Q")
        segments.frombytes(body[at : at + 16 * nsegments])
        at += 16 * nsegments
        nspans = count + (1 if flags & STREAM_IN_SHM else 0)
        spans = array("Q")
        spans.frombytes(body[at : at + 24 * nspans])
        at += 24 * nspans
        for index in range(nsegments):  # this message's descriptors, before anything can fail
            if segments[2 * index + 1]:
                self._maps.add(
                    segments[2 * index], self._inbox.fds.popleft(), segments[2 * index + 1]
                )
        # One holder per segment and message: every array/tensor built from it keeps
        # it alive (through the memoryviews' shared export); when the last one dies,
        # the segment is reported free, and only then may the producer reuse it.
        views: list[memoryview] = []
        for index in range(nsegments):
            segment_id = segments[2 * index]
            try:
                mapping = self._maps.get(segment_id)
            except OSError as err:
                views.clear()  # the holders made so far report their segments free
                self._frees.extend(segments[2 * i] for i in range(index, nsegments))
                err.add_note(
                    "pipeloom: could not map the shared memory of an item received from a "
                    "ProcessQueue; that item is lost, the queue stays usable (free memory, "
                    "or raise this process's limit: ulimit -v)"
                )
                raise
            extent = max(
                (spans[i + 1] + spans[i + 2] for i in range(0, 3 * nspans, 3) if spans[i] == index),
                default=1,
            )
            holder = np.frombuffer(mapping, np.uint8, max(extent, 1), 0)
            finalizer = weakref.finalize(holder, self._frees.append, segment_id)
            finalizer.atexit = False
            views.append(memoryview(holder))  # type: ignore[arg-type]
            del holder
        buffers = [
            views[spans[i]][spans[i + 1] : spans[i + 1] + spans[i + 2]]
            for i in range(0, 3 * count, 3)
        ]
        if flags & STREAM_IN_SHM:
            i = 3 * count
            stream: Any = views[spans[i]][spans[i + 1] : spans[i + 1] + spans[i + 2]]
        else:
            stream = memoryview(body)[at:]
        return stream, buffers

    def _send_frees(self) -> None:
        ids = array("I")
        while self._frees:
            ids.append(self._frees.popleft())
        try:
            send_frame(self._sock, Kind.FREE, ids.tobytes())
        except OSError:
            pass  # the producer is gone; nothing to reuse

    def close(self, send_close: bool) -> None:
        """Release this end; ``send_close=False`` after fork (touch nothing shared)."""
        if send_close:
            self._ctl[Slot.CONSUMER_CLOSED] = 1
            try:
                send_frame(self._sock, Kind.CLOSE)
            except OSError:
                pass
        self.readiness.close()
        self._inbox.close()
        self._maps.close()
        if self._producer_pidfd is not None:
            os.close(self._producer_pidfd)
            self._producer_pidfd = None
