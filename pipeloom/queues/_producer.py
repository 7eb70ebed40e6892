"""The sending half of a ProcessQueue, as used inside the producer process."""

from __future__ import annotations

import math
import os
import select
import socket
import struct
from array import array

import numpy as np

from pipeloom.errors import NotAvailable, QueueError
from pipeloom.queues._base import Deadline, QueueBroken, QueueClosed
from pipeloom.queues._control import Control, Slot
from pipeloom.queues._peer import FdSetReadiness, describe_exit, open_pidfd, wait_readable
from pipeloom.queues._shm import Segment, SegmentPool
from pipeloom.queues._wire import HEADER, MAX_FDS, Inbox, Kind, send_buffer, send_frame, writable

__all__ = ["INLINE_MAX", "SHM_META", "STREAM_IN_SHM", "ProducerEnd"]

INLINE_MAX = 64 * 1024
"""Pickle streams longer than this travel in shared memory, not the socket."""
SHM_META = struct.Struct("<HIB")  # segments referred to, buffer count, flags
"""An SHM_ITEM body: SHM_META; per segment (id, size if new to the consumer else 0);
per buffer, then for the stream if STREAM_IN_SHM, (segment index, offset, size),
all u64; then the pickle stream unless it is in shared memory."""
STREAM_IN_SHM = 1
_ALIGN = 64


class ProducerEnd:
    """Sends items, pools segments, waits for room; one per producer process."""

    def __init__(
        self,
        sock: socket.socket,
        ctl: Control,
        capacity: int,
        wake_fd: int,
        pool_bytes: int | None = None,
    ) -> None:
        self._sock = sock
        self._ctl = ctl
        self._capacity = capacity
        self._wake_fd = wake_fd
        self._returns = Inbox(64 * 1024)
        self._pool = SegmentPool(max_free=capacity + 2, max_free_bytes=pool_bytes)
        self._consumer_pid: int | None = None
        self._consumer_pidfd: int | None = None
        self._problem: Exception | None = None
        self._unsent_retired: list[int] = []  # the socket was full: sent with the next ones
        self._sent: list[int] = []  # bytes sent of a frame that raised (see send_frame)
        self._torn: QueueBroken | None = None  # a frame was cut short: nothing more can go
        self._sndbuf = send_buffer(sock)
        self.closed_here: str | None = None
        self.on_peer = lambda pid: None
        self.readiness = FdSetReadiness([sock.fileno(), wake_fd])
        send_frame(sock, Kind.HELLO, struct.pack("<q", os.getpid()))

    def put(
        self, stream: bytes, buffers: list[memoryview], block: bool, deadline: Deadline
    ) -> None:
        self.wait_for_room(block, deadline)
        if not buffers and len(stream) <= INLINE_MAX:
            self._send(Kind.ITEM, (stream,), how=(block, deadline), item=True)
            self._ctl[Slot.BYTES_INLINE] = self._ctl[Slot.BYTES_INLINE] + len(stream)
        else:
            self._send_via_shm(stream, buffers, (block, deadline))

    def _send(
        self,
        kind: int,
        parts: tuple[bytes | memoryview, ...],
        fds: tuple = (),
        *,
        how: tuple[bool, Deadline | None] = (True, None),
        closing: bool = False,
        item: bool = False,
    ) -> None:
        """Send a frame; the socket failing means the consumer is gone.

        An ``item`` is counted put only if its frame leaves: a put that failed
        before its first byte (no room in the socket in time, a close, Ctrl-C)
        takes no room in the queue. A frame cut short once started (only one
        longer than a writable socket takes whole) breaks the queue: the
        consumer would read the next frame as the rest of this one.
        """
        if self._torn is not None:
            raise self._torn
        ctl, sent = self._ctl, self._sent
        try:
            if item:  # (no call before it in the try: an interrupt cannot fall in between)
                ctl.slots[Slot.PUTS] += 1
            send_frame(
                self._sock,
                kind,
                *parts,
                fds=fds,
                wait=self._wait_writable,
                wait_args=(*how, closing),
                sndbuf=self._sndbuf,
                sent=sent,
            )
        except BaseException as error:
            done = sent.pop() if sent else 0
            if done == 0:
                if item:
                    ctl.slots[Slot.PUTS] -= 1
            elif done < 0 or done < HEADER.size + sum(map(len, parts)):
                some = "some" if done < 0 else f"{done}"
                self._torn = QueueBroken(
                    f"ProcessQueue: put() was cut short ({type(error).__name__}) after sending "
                    f"{some} bytes of a message; expected all of it or nothing, since its rest "
                    "cannot follow (the consumer would read a torn message). Nothing more can "
                    "be put in this queue: make a new one"
                )
                self._problem = self._torn
            if isinstance(error, OSError) and not isinstance(error, TimeoutError):
                raise self._broken(error) from error
            raise

    def _wait_writable(
        self, started: bool, block: bool, deadline: Deadline | None, closing: bool
    ) -> None:
        """Sleep until the full socket may take more of a frame, or raise.

        Before the frame's first byte, ``block``, the deadline and a close here
        (unless ``closing``) apply: nothing was sent. After it the frame must be
        finished (a torn one would hide the CLOSE sent after it), so only the
        consumer's death or close end the wait.
        """
        timeout = None if started or deadline is None else deadline.remaining()
        if not started and not block:
            # Ask for a WAKE when the consumer reads (it fires space_readiness), as
            # wait_for_room does, unless the socket took room meanwhile.
            self._ctl[Slot.WAITING] = 1
            self._ctl.fence()
            if not writable(self._sock.fileno()):
                raise NotAvailable("ProcessQueue's socket is full: the consumer is not reading")
            self._ctl[Slot.WAITING] = 0
            return
        if deadline is not None and timeout is not None and timeout <= 0:
            raise TimeoutError(
                f"ProcessQueue.put() timed out after {deadline.timeout}s: the consumer "
                "is not reading what was put (its socket is full)"
            )
        sock = self._sock.fileno()
        poller = select.poll()
        poller.register(sock, select.POLLOUT | select.POLLIN)
        # (A consumer in this process is closed with us: a torn frame does not matter.)
        here = self._ctl[Slot.CONSUMER_PID] == os.getpid()
        interruptible = not closing and (not started or here)
        for fd in (self._consumer_pidfd, self._wake_fd if interruptible else None):
            if fd is not None:
                poller.register(fd, select.POLLIN)
        ready = dict(poller.poll(None if timeout is None else math.ceil(timeout * 1000)))
        if interruptible and self.closed_here is not None:
            raise QueueClosed(self.closed_here)
        if ready.get(sock, 0) & select.POLLIN:  # frees, or the consumer's close
            self._read_returns(self._unsent_retired)
        if self._problem is not None:
            raise self._problem
        if self._consumer_pidfd in ready and not ready.get(sock, 0) & select.POLLOUT:
            self._problem = QueueBroken(describe_exit("consumer", self._consumer_pid))
            raise self._problem

    def _room(self) -> bool:
        ctl = self._ctl
        return ctl[Slot.PUTS] - ctl[Slot.GETS] < self._capacity

    def wait_for_room(self, block: bool, deadline: Deadline) -> None:
        ctl = self._ctl
        while True:
            self._raise_if_unusable()
            if self._room():
                return
            ctl[Slot.WAITING] = 1  # ask the consumer for a wake-up frame...
            ctl.fence()
            if self._room():  # ...unless room was made meanwhile
                ctl[Slot.WAITING] = 0
                return
            if not block:
                raise NotAvailable(f"ProcessQueue is full (capacity {self._capacity})")
            fds = [self._sock.fileno(), self._wake_fd]
            if self._consumer_pidfd is not None:
                fds.append(self._consumer_pidfd)
            ready = wait_readable(fds, deadline.remaining())
            if not ready and deadline.expired():
                ctl[Slot.WAITING] = 0
                raise TimeoutError(
                    f"ProcessQueue.put() timed out after {deadline.timeout}s: the queue "
                    f"stayed full (capacity {self._capacity}); is the consumer getting items?"
                )
            self.drain_returns()
            if self._consumer_pidfd in ready and not self._room() and self._problem is None:
                self._problem = QueueBroken(describe_exit("consumer", self._consumer_pid))

    def _raise_if_unusable(self) -> None:
        if self.closed_here is not None:
            raise QueueClosed(self.closed_here)
        if self._problem is not None:
            raise self._problem
        if self._ctl[Slot.CONSUMER_CLOSED]:
            who = f"consumer process {self._consumer_pid}" if self._consumer_pid else "consumer"
            self._problem = QueueClosed(f"the {who} closed the queue; put() is refused")
            raise self._problem

    def trim(self, min_size: int) -> None:
        """Take back what the consumer freed, then retire free segments of ``min_size`` or more."""
        self.drain_returns()
        self._send_retired(self._pool.trim(min_size))
        self._ctl[Slot.SHM_BYTES_HELD] = self._pool.held_bytes

    def drain_returns(self) -> None:
        """Handle every frame the consumer sent back (frees, wake-ups, hello, close)."""
        retired = self._pool.collect_dropped()
        self._read_returns(retired)
        self._ctl[Slot.SHM_BYTES_HELD] = self._pool.held_bytes
        self._send_retired(retired)

    def _read_returns(self, retired: list[int]) -> None:
        """Read and handle what the consumer sent; segments retired meanwhile go to ``retired``."""
        try:
            while True:
                frame = self._returns.next_frame()
                if frame is None:
                    if not self._returns.fill(self._sock):
                        break
                    continue
                self._handle_return(*frame, retired)
        except OSError as err:
            self._problem = self._broken(err)
        if self._returns.eof and self._problem is None:
            self._problem = self._broken(None)

    def _send_retired(self, retired: list[int]) -> None:
        retired = self._unsent_retired + retired
        self._unsent_retired = []
        if retired:
            try:
                self._send(Kind.RETIRE, (array("I", retired).tobytes(),), how=(False, None))
            except NotAvailable:  # the socket is full: with the next ones
                self._unsent_retired = retired
            except QueueError:
                pass  # the consumer is gone or closed: nothing to unmap

    def _handle_return(self, kind: int, body: bytes, retired: list[int]) -> None:
        if kind == Kind.FREE:
            for segment_id in array("I", body):
                gone = self._pool.release(segment_id)
                if gone is not None:
                    retired.append(gone)
        elif kind == Kind.HELLO:
            (pid,) = struct.unpack("<q", body)
            if pid != os.getpid():
                self._consumer_pid = pid
                self._consumer_pidfd = open_pidfd(pid)
                if self._consumer_pidfd is not None:
                    self.readiness.add_fd(self._consumer_pidfd)
                self.on_peer(pid)
        elif kind == Kind.CLOSE:
            who = f"consumer process {self._consumer_pid}" if self._consumer_pid else "consumer"
            self._problem = QueueClosed(f"the {who} closed the queue; put() is refused")

    def _broken(self, err: OSError | None) -> QueueBroken | QueueClosed:
        if self._ctl[Slot.CONSUMER_CLOSED]:
            return QueueClosed("the consumer closed the queue; put() is refused")
        reason = describe_exit("consumer", self._consumer_pid)
        return QueueBroken(reason if err is None else f"{reason} ({err.strerror or err})")

    def allocate(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of shared memory to build an item in; put() then sends it uncopied."""
        self._raise_if_unusable()
        self.drain_returns()
        try:
            array = self._pool.allocate(nbytes)
        except OSError as err:
            raise _no_shared_memory(nbytes, err) from err
        self._ctl[Slot.SHM_BYTES_HELD] = self._pool.held_bytes
        return array

    def _send_via_shm(
        self, stream: bytes, buffers: list[memoryview], how: tuple[bool, Deadline]
    ) -> None:
        self.drain_returns()  # take back freed segments first, so they get reused
        pool = self._pool
        used: list[Segment] = []  # the segments the message refers to, by index
        spans = array("Q")  # (segment index, offset, size) per buffer, then the stream's
        copies: list[tuple[int, memoryview | bytes]] = []  # (span, what to copy there)
        end = uncopied = 0
        for buffer in buffers:
            found = pool.locate(buffer)
            if found is None:  # copied into this message's own segment, placed below
                copies.append((len(spans), buffer))
                spans.extend((0, end, buffer.nbytes))
                end = -(-(end + buffer.nbytes) // _ALIGN) * _ALIGN
            else:  # built in an allocated segment: referred to, not copied
                segment, offset = found
                uncopied += buffer.nbytes
                if segment not in used:
                    used.append(segment)
                spans.extend((used.index(segment), offset, buffer.nbytes))
        flags = 0
        if len(stream) > INLINE_MAX:
            flags |= STREAM_IN_SHM
            copies.append((len(spans), stream))
            spans.extend((0, end, len(stream)))
            end += len(stream)
        try:
            own = pool.acquire(end) if copies else None
        except OSError as err:
            raise _no_shared_memory(end, err) from err
        try:
            if own is not None:
                for span, data in copies:
                    spans[span] = len(used)
                    dst = np.frombuffer(own.mapping, np.uint8, spans[span + 2], spans[span + 1])
                    np.copyto(dst, np.frombuffer(data, np.uint8))
                used.append(own)
            fresh = [segment for segment in used if not segment.announced]
            while len(fresh) > MAX_FDS:  # more descriptors than one frame carries
                self._announce(fresh[:MAX_FDS], how)
                del fresh[:MAX_FDS]
            header = array("Q")
            fds = []
            for segment in used:
                header.extend((segment.id, 0 if segment.announced else segment.size))
                if not segment.announced:
                    fds.append(segment.fd)
            meta = SHM_META.pack(len(used), len(buffers), flags)
            tail = b"" if flags & STREAM_IN_SHM else stream
            parts = (meta, header.tobytes(), spans.tobytes(), tail)
            self._send(Kind.SHM_ITEM, parts, tuple(fds), how=how, item=True)
        except BaseException:
            if own is not None:
                pool.discard(own)
            raise
        for segment in used:
            segment.announced = True
            if segment is not own:
                pool.lend(segment)
        ctl = self._ctl
        ctl[Slot.BYTES_VIA_SHM] = ctl[Slot.BYTES_VIA_SHM] + end + uncopied
        ctl[Slot.BYTES_UNCOPIED] = ctl[Slot.BYTES_UNCOPIED] + uncopied
        ctl[Slot.SEGMENTS_CREATED] = pool.created
        ctl[Slot.SEGMENTS_REUSED] = pool.reused
        ctl[Slot.SHM_BYTES_HELD] = pool.held_bytes
        ctl[Slot.BYTES_INLINE] = ctl[Slot.BYTES_INLINE] + len(tail)

    def _announce(self, segments: list[Segment], how: tuple[bool, Deadline]) -> None:
        """Hand the consumer these segments' descriptors ahead of the message using them."""
        body = array("Q")
        for segment in segments:
            body.extend((segment.id, segment.size))
        self._send(Kind.ANNOUNCE, (body.tobytes(),), tuple(s.fd for s in segments), how=how)
        for segment in segments:
            segment.announced = True

    def close(self, send_close: bool) -> None:
        """Release this end; ``send_close=False`` after fork (touch nothing shared)."""
        if send_close:
            self._ctl[Slot.PRODUCER_CLOSED] = 1
            self._ctl[Slot.SHM_BYTES_HELD] = 0
            # Wait for room only for a consumer that reads: one in another process. (None
            # bound yet, or this process: then only if there is room; it sees end-of-file.)
            try:
                reader = self._ctl[Slot.CONSUMER_PID] not in (0, os.getpid())
                self._send(Kind.CLOSE, (), how=(reader, None), closing=True)
            except (NotAvailable, QueueError):
                pass  # gone or closed already
        self.readiness.close()
        self._pool.close()
        self._returns.close()
        if self._consumer_pidfd is not None:
            os.close(self._consumer_pidfd)
            self._consumer_pidfd = None


def _no_shared_memory(nbytes: int, err: OSError) -> OSError:
    return OSError(
        err.errno,
        f"ProcessQueue: the system refused {nbytes} bytes of shared memory for an item "
        f"({err.strerror or err}); nothing was sent and the queue stays usable. Free memory "
        "or descriptors, raise this process's limits (ulimit -v, ulimit -n), or send "
        "smaller items",
    )
