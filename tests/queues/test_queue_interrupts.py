"""Ctrl-C (KeyboardInterrupt) at the worst moments of a ProcessQueue's get and put.

Python runs a signal handler when a call made from Python code returns, so a
Ctrl-C that arrives while a socket read is in the kernel raises as that read
returns. The tests raise at exactly that point with a profile hook (on the
return of the call that took bytes off the socket), and inside the unpickling
of an item: the next get must return the interrupted item, then the rest, in
order -- never a wrong item.
"""

from __future__ import annotations

import fcntl
import signal
import socket
import struct
import sys
import termios
import threading

import pytest
import torch

from pipeloom.errors import NotAvailable
from pipeloom.queues import ProcessQueue, QueueBroken

LINE = "x" * 60_000  # one item sent through the socket itself


def _unread(fd: int) -> int:
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]


def _interrupt_when_a_call_returns(fd: int, *, read: bool):
    """A profile hook raising KeyboardInterrupt once, when the first call made from
    Python that took bytes off (``read``) or put bytes into socket ``fd`` returns:
    where Python runs the handler of a Ctrl-C that arrived during the call."""
    unread_at_call: list[int] = []

    def hook(frame, event, arg):
        if event == "c_call":
            unread_at_call.append(_unread(fd))
        elif event in ("c_return", "c_exception") and unread_at_call:
            before, now = unread_at_call.pop(), _unread(fd)
            if event == "c_return" and (before > now if read else before < now):
                sys.setprofile(None)
                raise KeyboardInterrupt

    return hook


def test_ctrl_c_as_a_socket_read_returns_mid_frame_loses_no_byte():
    with ProcessQueue(capacity=8) as q:
        items = [f"{i}{LINE}" for i in range(6)]  # 360 kB: the first read ends mid-frame
        for item in items:
            q.put(item, timeout=5)
        fd = q._socks["consumer"].fileno()
        sys.setprofile(_interrupt_when_a_call_returns(fd, read=True))
        try:
            with pytest.raises(KeyboardInterrupt):
                q.get(timeout=5)
        finally:
            sys.setprofile(None)
        assert [q.get(timeout=5) for _ in items] == items
        q.put("after", timeout=5)
        assert q.get(timeout=5) == "after"


@pytest.mark.parametrize("size", [10, 40_000], ids=["one-piece", "checked-first"])
def test_ctrl_c_as_a_send_returns_counts_the_item_it_sent(size):
    """put() raises, but its item left whole: it is counted, and got, once."""
    with ProcessQueue(capacity=8) as q:
        q.readiness()
        fd = q._socks["consumer"].fileno()
        items = [f"{i}" * size for i in range(3)]
        q.put(items[0], timeout=5)
        sys.setprofile(_interrupt_when_a_call_returns(fd, read=False))
        try:
            with pytest.raises(KeyboardInterrupt):
                q.put(items[1], timeout=5)
        finally:
            sys.setprofile(None)
        assert q.qsize() == 2
        q.put(items[2], timeout=5)
        assert [q.get(timeout=5) for _ in items] == items
        assert q.qsize() == 0


_interrupted: set[str] = set()


def _interrupt_once(key: str) -> str:
    if key not in _interrupted:
        _interrupted.add(key)
        raise KeyboardInterrupt
    return key


class _CtrlCWhileUnpickled:
    """Unpickling it raises KeyboardInterrupt the first time (Ctrl-C during a long load)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __reduce__(self):
        return _interrupt_once, (self.key,)


@pytest.mark.parametrize("size", [10, 300_000], ids=["in-socket", "in-shm"])
def test_ctrl_c_while_an_item_is_unpickled_leaves_it_to_the_next_get(size):
    key = f"unpickled-{size}"
    with ProcessQueue(capacity=4) as q:
        q.put([torch.full((size,), 1.0), _CtrlCWhileUnpickled(key)], timeout=5)
        q.put([torch.full((size,), 2.0), "next"], timeout=5)
        with pytest.raises(KeyboardInterrupt):
            q.get(timeout=5)
        first, second = q.get(timeout=5), q.get(timeout=5)
        assert first[1] == key and torch.equal(first[0], torch.full((size,), 1.0))
        assert second[1] == "next" and torch.equal(second[0], torch.full((size,), 2.0))
        for i in range(6):  # the interrupted item's memory is not reused under it
            q.put(torch.full((size,), float(i)), timeout=5)
            assert float(q.get(timeout=5)[-1]) == i
        assert torch.equal(first[0], torch.full((size,), 1.0))
        assert q.qsize() == 0


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


def test_ctrl_c_while_put_waits_for_room_in_the_socket_sends_nothing_and_takes_no_room():
    with ProcessQueue(capacity=1000) as q:
        q.readiness()  # the consumer end is this process's; it does not read yet
        sent = 0
        with pytest.raises(NotAvailable):
            while True:
                q.put(LINE, block=False)
                sent += 1
        previous = signal.signal(signal.SIGALRM, _raise_keyboard_interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            with pytest.raises(KeyboardInterrupt):
                q.put(LINE, timeout=5)  # waits for room in the socket
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        assert q.qsize() == sent
        assert all(q.get(timeout=5) == LINE for _ in range(sent))
        q.put("after", timeout=5)
        assert q.get(timeout=5) == "after"
        assert q.qsize() == 0


def test_ctrl_c_mid_message_breaks_the_queue_instead_of_tearing_the_stream():
    """A message longer than the socket ever takes whole waits once started; cut short
    there, nothing more may follow it (the consumer would read it as the rest)."""
    with ProcessQueue(capacity=8) as q:
        q._socks["producer"].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16_384)
        q.readiness()  # the consumer end is this process's; it does not read yet
        q.put("first", timeout=5)
        previous = signal.signal(signal.SIGALRM, _raise_keyboard_interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            with pytest.raises(KeyboardInterrupt):
                q.put(LINE)  # 60 kB: part of it fills the 32 kB buffer, the rest waits
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        with pytest.raises(QueueBroken, match="cut short .*after sending \\d+ bytes"):
            q.put("next", timeout=5)
        assert q.get(timeout=5) == "first"


# -- a consumer that does not read ---------------------------------------------------


def _put_until_refused(q: ProcessQueue, item: str, outcome: list) -> None:
    sent = 0
    try:
        while True:
            q.put(item, block=False)
            sent += 1
    except NotAvailable:
        outcome.append(sent)
    try:
        q.put(item, timeout=0.1)
    except TimeoutError:
        outcome.append("timed out")


@pytest.mark.parametrize("size", [40_000, 47_000, 55_000])
def test_put_without_blocking_never_waits_for_the_rest_of_a_message(size):
    """A message the socket takes only in part is not started: NotAvailable, nothing sent."""
    item = "y" * size
    with ProcessQueue(capacity=1000) as q:
        q.readiness()  # the consumer end is this thread's, which does not read yet
        outcome: list = []
        putter = threading.Thread(target=_put_until_refused, args=(q, item, outcome))
        putter.start()
        putter.join(5)
        stuck = putter.is_alive()
        while putter.is_alive():  # it waits for the rest of a message: read, let it end
            q.get(timeout=1)
        assert not stuck, "put(block=False) waited for the consumer"
        assert outcome[1:] == ["timed out"]
        assert q.qsize() == outcome[0]
        assert all(q.get(timeout=5) == item for _ in range(outcome[0]))
