"""Framed messages over a Unix stream socket, with file descriptors attached.

A frame is ``<u32 body length><u8 kind>`` followed by the body. Descriptors
(``SCM_RIGHTS``) ride with the frame that needs them; the kernel hands them
over with the first byte of that frame, so the receiver keeps them in a FIFO
and each frame takes the ones it announced.

The receiver reads everything available in one ``recvmsg_into`` and parses
frames from its buffer, so a burst of small messages costs one system call;
a partly arrived frame stays buffered (the socket is drained, so a waiter
watching it sleeps until the rest arrives -- no busy loop).
"""

from __future__ import annotations

import array
import collections
import fcntl
import os
import select
import socket
import struct
from collections.abc import Callable

__all__ = [
    "ATOMIC_MAX",
    "HEADER",
    "MAX_FDS",
    "Inbox",
    "Kind",
    "send_buffer",
    "send_frame",
    "writable",
]

HEADER = struct.Struct("<IB")
MAX_FDS = 64
"""The most descriptors one frame may carry (the receiver has room for no more)."""
_FLAGS = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
_ANC = (socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize),)
_RECV_FLAGS = (int(socket.MSG_DONTWAIT | _FLAGS),)
_BLOCKING = int(socket.MSG_NOSIGNAL)  # plain ints: or-ing the enum costs ~1 us per frame
_NON_BLOCKING = int(socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
_SIOCOUTQ = 0x5411  # Linux: the bytes of a socket's send queue not read yet
ATOMIC_MAX = 32 * 1024
"""A frame this long or shorter is sent whole or not at all (the kernel queues it as one piece)."""


class Kind:
    """Frame kinds (producer to consumer, then consumer to producer)."""

    ITEM = 1  # body: pickle stream
    SHM_ITEM = 2  # body: shm descriptor + stream (see _process)
    RETIRE = 3  # body: u32 segment ids the consumer should unmap
    HELLO = 4  # body: i64 pid of the process binding an end
    CLOSE = 5  # empty: the sender closed the queue
    FREE = 6  # body: u32 segment ids the consumer no longer uses
    WAKE = 7  # empty: room was made while the producer waited
    ANNOUNCE = 8  # body: (u64 id, u64 size) per segment; its fds ride along (see _producer)


def send_buffer(sock: socket.socket) -> int:
    """The bytes ``sock`` may hold unread (its send buffer), for :func:`send_frame`."""
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)


def _goes_whole(fd: int, total: int, sndbuf: int) -> bool:
    """Whether a frame of ``total`` bytes leaves in one call now: the kernel takes each
    piece of it while less than ``sndbuf`` bytes (bookkeeping included, a sixteenth
    is ample) are unread."""
    queued = struct.unpack("i", fcntl.ioctl(fd, _SIOCOUTQ, b"\0\0\0\0"))[0]
    return queued + total + total // 16 + 4096 <= sndbuf


def writable(fd: int) -> bool:
    """Whether poll says ``fd`` may be written now (no waiting)."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return bool(poller.poll(0))


def send_frame(
    sock: socket.socket,
    kind: int,
    *parts: bytes | memoryview,
    fds: tuple = (),
    wait: Callable[..., None] | None = None,
    wait_args: tuple = (),
    sndbuf: int = 0,
    sent: list[int] | None = None,
) -> None:
    """Send one frame. Raises OSError if the peer is gone.

    Without ``wait`` it blocks until the frame is written (small control frames).

    With ``wait`` it never blocks in the kernel (where neither the peer's
    death, while another process holds a copy of its socket, nor a close would
    wake it): while the socket cannot take the frame it calls ``wait(started,
    *wait_args)``, which sleeps until the socket may take more or raises to
    give up. A frame is started only when it leaves whole (one of at most
    :data:`ATOMIC_MAX` bytes always does; a longer one when the unread bytes
    leave room for it, ``sndbuf`` being the socket's buffer), so giving up
    never leaves part of it sent. Only a frame longer than a writable socket
    surely takes (poll says writable while a quarter of ``sndbuf`` is in use:
    about 5/8 of ``sndbuf``) may have to wait once started (``started=True``;
    giving up then leaves a torn frame). When an exception escapes (Ctrl-C
    included, even as a send returns), the bytes of the frame sent are appended
    to ``sent`` (-1: some, how many is unknown), so the caller knows whether
    the frame left whole, in part or not at all.
    """
    size = sum(len(part) if isinstance(part, bytes) else part.nbytes for part in parts)
    chunks = [HEADER.pack(size, kind), *parts]
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    total = HEADER.size + size
    if wait is None:
        done = sock.sendmsg(chunks, ancillary, _BLOCKING)
        if done < total:  # a big frame or an interrupted send: write the rest
            sock.sendall(b"".join(bytes(chunk) for chunk in chunks)[done:], _BLOCKING)
        return
    # Longer than one piece but no longer than a writable socket surely takes: sent
    # only whole (a wait until poll says writable makes room for it).
    check = total > ATOMIC_MAX and total <= sndbuf * 3 // 4 - sndbuf // 16 - 4096
    done = calling = 0  # calling: inside a send, whose count an interrupt would lose
    try:
        while True:
            if check and not _goes_whole(sock.fileno(), total, sndbuf):
                wait(False, *wait_args)
                continue
            try:
                calling = 1
                done = sock.sendmsg(chunks, ancillary, _NON_BLOCKING)
                calling = 0
                break
            except BlockingIOError:
                calling = 0
                wait(False, *wait_args)  # nothing of it was sent
        if done < total:  # longer than a writable socket surely takes: the rest
            data = memoryview(b"".join(bytes(chunk) for chunk in chunks))
            while done < total:
                try:
                    calling = 2
                    done = done + sock.send(data[done:], _NON_BLOCKING)
                    calling = 0
                except BlockingIOError:
                    calling = 0
                    wait(True, *wait_args)
    except BaseException as error:
        # An error raised while calling=1 or 2 that is not the call's own (an OSError)
        # came from a signal handler run as the call returned: the bytes went.
        if sent is not None:
            if calling and not isinstance(error, OSError):
                whole = calling == 1 and (total <= ATOMIC_MAX or check)
                sent.append(total if whole else -1)  # -1: some, how many unknown
            else:
                sent.append(done)
        raise


class Inbox:
    """Receive buffer: bytes read but not yet parsed, and received fds."""

    def __init__(self, size: int = 256 * 1024) -> None:
        self._buf = bytearray(size)
        self._start = 0
        self._end = 0
        self.fds: collections.deque[int] = collections.deque()
        self.eof = False
        self._reads: list[tuple[int, list, int, object]] = []  # made, not committed yet

    def next_frame(self) -> tuple[int, bytes] | None:
        """The next complete frame as ``(kind, body)``, taken; or None."""
        frame = self.peek()
        if frame is None:
            return None
        self.take(frame[2])
        return frame[0], frame[1]

    def peek(self) -> tuple[int, bytes, int] | None:
        """The next complete frame as ``(kind, body, after)``, left in the buffer; or None.

        :meth:`take` ``(after)`` then drops it: a caller interrupted between
        the two (Ctrl-C) finds the same frame again.
        """
        if self._reads:
            self._commit_reads()
        available = self._end - self._start
        if available < HEADER.size:
            return None
        size, kind = HEADER.unpack_from(self._buf, self._start)
        if available < HEADER.size + size:
            self._make_room(HEADER.size + size)
            return None
        begin = self._start + HEADER.size
        return kind, bytes(self._buf[begin : begin + size]), begin + size

    def take(self, after: int) -> None:
        """Drop the frames before offset ``after`` (from :meth:`peek`); idempotent
        until the next :meth:`peek` or :meth:`fill`."""
        self._start = after

    def fill(self, sock: socket.socket) -> bool:
        """Read what is available without blocking; False if nothing was.

        Sets :attr:`eof` when the peer's end is closed. Raises ``OSError``
        (e.g. ``ConnectionResetError``) if the connection broke.

        Exact under Ctrl-C: a Python signal handler runs (and raises
        ``KeyboardInterrupt``) when a call made from Python code returns. The
        read is therefore made from C (``list.extend`` over a ``map``), which
        stores its result in :attr:`_reads` before any handler can run, and
        that result is committed by statements that contain no call: an
        interrupt leaves the bytes either uncounted in ``_reads`` (counted by
        the next fill) or counted, never lost.
        """
        self._commit_reads()
        if self._start == self._end:
            self._start = self._end = 0
        if self._end == len(self._buf):
            self._make_room(len(self._buf) + 1)
        view = memoryview(self._buf)[self._end :]
        try:
            self._reads.extend(map(sock.recvmsg_into, ([view],), _ANC, _RECV_FLAGS))
        except (BlockingIOError, InterruptedError):
            return False
        finally:
            view.release()
        return self._commit_reads()

    def _commit_reads(self) -> bool:
        if not self._reads:
            return False
        nbytes, ancdata, _, _ = self._reads[0]
        fds = array.array("i")
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        received = tuple(fds)
        # The commit: no call from here on, so no signal handler runs in between.
        self._end += nbytes
        self.fds += received
        del self._reads[:]
        if nbytes == 0 and not ancdata:
            self.eof = True
            return False
        return True

    def holds_part_of_a_frame(self) -> bool:
        """Whether bytes read are left over (at end-of-file: a frame cut short)."""
        return self._end > self._start or bool(self._reads)

    def _make_room(self, frame_size: int) -> None:
        if self._start:
            pending = self._end - self._start
            self._buf[:pending] = self._buf[self._start : self._end]
            self._start, self._end = 0, pending
        if frame_size > len(self._buf):
            self._buf.extend(bytes(max(frame_size, 2 * len(self._buf)) - len(self._buf)))

    def close(self) -> None:
        """Close descriptors received but never claimed."""
        while self.fds:
            os.close(self.fds.popleft())
