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
import os
import socket
import struct
from collections.abc import Callable

__all__ = ["HEADER", "MAX_FDS", "Inbox", "Kind", "send_frame"]

HEADER = struct.Struct("<IB")
MAX_FDS = 64
"""The most descriptors one frame may carry (the receiver has room for no more)."""
_ANC_SIZE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
_FLAGS = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
_BLOCKING = int(socket.MSG_NOSIGNAL)  # plain ints: or-ing the enum costs ~1 us per frame
_NON_BLOCKING = int(socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)


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


def send_frame(
    sock: socket.socket,
    kind: int,
    *parts: bytes | memoryview,
    fds: tuple = (),
    wait: Callable[..., None] | None = None,
    wait_args: tuple = (),
) -> None:
    """Send one frame. Raises OSError if the peer is gone.

    Without ``wait`` it blocks until the frame is written. With ``wait`` it
    never blocks in the kernel (where neither the peer's death, while another
    process holds a copy of its socket, nor a close would wake it): while the
    socket is full it calls ``wait(started, *wait_args)``, which sleeps until the socket
    may take more or raises to give up. ``started``: part of the frame is sent
    already, so giving up leaves a torn frame (only for a queue that is over).
    """
    size = sum(len(part) if isinstance(part, bytes) else part.nbytes for part in parts)
    chunks = [HEADER.pack(size, kind), *parts]
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    flags = _BLOCKING if wait is None else _NON_BLOCKING
    while True:
        try:
            sent = sock.sendmsg(chunks, ancillary, flags)
            break
        except BlockingIOError:
            wait(False, *wait_args)  # type: ignore[misc]  # only raised with MSG_DONTWAIT
    total = HEADER.size + size
    if sent < total:  # a big frame or an interrupted send: write the rest
        rest = memoryview(b"".join(bytes(chunk) for chunk in chunks))[sent:]
        if wait is None:
            sock.sendall(rest, socket.MSG_NOSIGNAL)
        while wait is not None and rest:
            try:
                rest = rest[sock.send(rest, flags) :]
            except BlockingIOError:
                wait(True, *wait_args)


class Inbox:
    """Receive buffer: bytes read but not yet parsed, and received fds."""

    def __init__(self, size: int = 256 * 1024) -> None:
        self._buf = bytearray(size)
        self._start = 0
        self._end = 0
        self.fds: collections.deque[int] = collections.deque()
        self.eof = False

    def next_frame(self) -> tuple[int, bytes] | None:
        """The next complete frame as ``(kind, body)``, or None."""
        available = self._end - self._start
        if available < HEADER.size:
            return None
        size, kind = HEADER.unpack_from(self._buf, self._start)
        if available < HEADER.size + size:
            self._make_room(HEADER.size + size)
            return None
        begin = self._start + HEADER.size
        body = bytes(self._buf[begin : begin + size])
        self._start = begin + size
        if self._start == self._end:
            self._start = self._end = 0
        return kind, body

    def fill(self, sock: socket.socket) -> bool:
        """Read what is available without blocking; False if nothing was.

        Sets :attr:`eof` when the peer's end is closed. Raises ``OSError``
        (e.g. ``ConnectionResetError``) if the connection broke.
        """
        if self._end == len(self._buf):
            self._make_room(len(self._buf) + 1)
        view = memoryview(self._buf)[self._end :]
        try:
            nbytes, ancdata, _, _ = sock.recvmsg_into(
                [view], _ANC_SIZE, socket.MSG_DONTWAIT | _FLAGS
            )
        except (BlockingIOError, InterruptedError):
            return False
        finally:
            view.release()
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                self.fds.extend(fds)
        if nbytes == 0 and not ancdata:
            self.eof = True
            return False
        self._end += nbytes
        return True

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
