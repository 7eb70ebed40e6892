"""Waiter: event-driven waiting on threads' signals and other processes' fds."""

from __future__ import annotations

import os
import threading
import time

import pytest

from pipeloom.datapipes import BlockingReader, IterDataPipe
from pipeloom.errors import NotAvailable
from pipeloom.events import FdReadiness, Signal, Waiter


@pytest.fixture
def pipe_fds():
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    os.close(read_fd)
    os.close(write_fd)


def test_an_fd_wakes_when_it_becomes_readable_not_while_data_waits_unread(pipe_fds):
    read_fd, write_fd = pipe_fds
    waiter = Waiter()
    FdReadiness(read_fd).attach(waiter)
    seen = waiter.generation
    assert not waiter.wait(seen, timeout=0.05)  # nothing yet
    os.write(write_fd, b"a")
    assert waiter.wait(seen, timeout=1.0)
    # The consumer leaves the byte unread (e.g. it waits for another worker's
    # item first): waiting again must sleep, not return at once forever.
    started = time.monotonic()
    assert not waiter.wait(seen, timeout=0.2)
    assert time.monotonic() - started >= 0.15
    os.write(write_fd, b"b")  # new data wakes it, even with old data unread
    assert waiter.wait(seen, timeout=1.0)
    assert os.read(read_fd, 10) == b"ab"
    waiter.close()


def test_an_fd_already_readable_when_watched_wakes_the_first_wait(pipe_fds):
    read_fd, write_fd = pipe_fds
    os.write(write_fd, b"x")
    waiter = Waiter()
    FdReadiness(read_fd).attach(waiter)
    assert waiter.wait(waiter.generation, timeout=1.0)
    waiter.close()


def test_a_write_from_another_thread_wakes_a_blocked_wait(pipe_fds):
    read_fd, write_fd = pipe_fds
    waiter = Waiter()
    FdReadiness(read_fd).attach(waiter)
    timer = threading.Timer(0.05, os.write, (write_fd, b"x"))
    timer.start()
    assert waiter.wait(waiter.generation, timeout=5.0)
    timer.join()
    waiter.close()


def test_a_signal_wakes_a_waiter_that_also_watches_fds(pipe_fds):
    read_fd, _ = pipe_fds
    waiter, signal = Waiter(), Signal()
    FdReadiness(read_fd).attach(waiter)
    signal.attach(waiter)
    seen = waiter.generation
    threading.Timer(0.05, signal.fire).start()
    assert waiter.wait(seen, timeout=5.0)
    assert waiter.generation != seen
    waiter.close()


class _NeverReady(IterDataPipe):
    """Always NotAvailable, while a thread fires its signal every 10 ms."""

    def __init__(self) -> None:
        self.signal = Signal()
        self.attempts = 0

    def async_next(self):
        self.attempts += 1
        raise NotAvailable

    def readiness_sources(self):
        return [self.signal]

    def reset(self) -> None:
        pass


def test_a_reader_timeout_bounds_the_whole_wait_not_each_wake_up():
    block = _NeverReady()
    stop = threading.Event()

    def keep_waking():
        while not stop.wait(0.01):
            block.signal.fire()

    thread = threading.Thread(target=keep_waking)
    thread.start()
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="within 0.3 s"):
            BlockingReader(block).next(timeout=0.3)
        assert time.monotonic() - started >= 0.25  # not early; a hang trips the test timeout
        assert block.attempts > 3  # it did retry on each wake-up
    finally:
        stop.set()
        thread.join()
