"""Event-driven waiting, shared by blocks and queues.

A consumer that got ``NotAvailable`` sleeps on a :class:`Waiter` until one of
the readiness sources it is attached to reports progress. Nothing here polls:
threads wake a waiter through a :class:`Signal`; file descriptors (pipes,
sockets, eventfds of other processes) are watched with a selector through
:class:`FdReadiness`. On Linux the selector is edge-triggered: an fd wakes the
waiter when it *becomes* readable (new data, a hang-up), so data a consumer
chose to leave unread for now (e.g. a worker that is ahead of the one whose
item comes next) does not wake it again and again.

Example:
    >>> signal, waiter = Signal(), Waiter()
    >>> signal.attach(waiter)
    >>> seen = waiter.generation
    >>> signal.fire()              # e.g. a producer thread stored an item
    >>> waiter.wait(seen, timeout=1.0)
    True
"""

from __future__ import annotations

import os
import select
import selectors
import threading
import weakref
from typing import Protocol, runtime_checkable

__all__ = ["FdReadiness", "ReadinessSource", "Signal", "Waiter", "blocked_waits"]

_BLOCKED = threading.local()  # per thread: waits that found nothing new (statistics)


def blocked_waits() -> int:
    """How many times the calling thread called ``Waiter.wait`` with nothing new yet.

    A loader collecting statistics compares it around ``next()``: unchanged
    means the output was ready. One increment per blocking wait, none per item.
    """
    return getattr(_BLOCKED, "count", 0)


class Waiter:
    """Where one consumer sleeps until a readiness source makes progress.

    ``generation`` increases on every :meth:`wake`; a consumer reads it, tries a
    non-blocking call, and on ``NotAvailable`` calls ``wait(seen)``, which
    returns at once if a wake happened since ``seen``. No wake-up is lost.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._generation = 0
        self._fd_refs: dict[int, int] = {}
        self._selector: _Selector | None = None
        self._wake_fds: tuple[int, int] | None = None
        self._selecting = 0
        self._finalizer: weakref.finalize | None = None

    @property
    def generation(self) -> int:
        """A counter that changes whenever this waiter is woken."""
        return self._generation

    def wake(self) -> None:
        """Wake the consumer (callable from any thread)."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
            if self._selecting and self._wake_fds is not None:
                os.write(self._wake_fds[1], b"\x00\x00\x00\x00\x00\x00\x00\x01")

    def wait(self, seen_generation: int, timeout: float | None = None) -> bool:
        """Sleep until woken after ``seen_generation`` or a watched fd became readable.

        Returns False only when ``timeout`` (seconds) expired first. A wake-up
        means "try again", never "an item is there": callers loop.
        """
        if self._generation == seen_generation:
            _BLOCKED.count = getattr(_BLOCKED, "count", 0) + 1
        if not self._fd_refs:
            with self._cond:
                return self._cond.wait_for(lambda: self._generation != seen_generation, timeout)
        return self._wait_selecting(seen_generation, timeout)

    def _wait_selecting(self, seen_generation: int, timeout: float | None) -> bool:
        with self._cond:
            if self._generation != seen_generation:
                return True
            self._selecting += 1
        assert self._selector is not None and self._wake_fds is not None
        try:
            ready = self._selector.select(timeout)
        finally:
            with self._cond:
                self._selecting -= 1
        if self._wake_fds[0] in ready:
            _drain(self._wake_fds[0])
        return bool(ready) or self._generation != seen_generation

    def watch_fd(self, fd: int) -> None:
        """Also return from :meth:`wait` when ``fd`` becomes readable."""
        with self._cond:
            if fd in self._fd_refs:
                self._fd_refs[fd] += 1
                return
            if self._selector is None:
                self._selector = _Selector()
                self._wake_fds = _make_wake_fds()
                self._selector.register(self._wake_fds[0])
                self._finalizer = weakref.finalize(
                    self, _close_selector, self._selector, self._wake_fds
                )
            self._selector.register(fd)
            self._fd_refs[fd] = 1

    def unwatch_fd(self, fd: int) -> None:
        """Stop watching ``fd`` (once per :meth:`watch_fd`)."""
        with self._cond:
            count = self._fd_refs.get(fd, 0)
            if count > 1:
                self._fd_refs[fd] = count - 1
            elif count == 1:
                del self._fd_refs[fd]
                assert self._selector is not None
                self._selector.unregister(fd)

    def close(self) -> None:
        """Release the file descriptors this waiter opened."""
        if self._finalizer is not None:
            self._finalizer()


class _Selector:
    """Watches fds for readability: edge-triggered epoll on Linux, else a selector.

    Edge-triggered, an fd is reported once each time it becomes readable
    (each arrival on a socket, each write to an eventfd, a peer's exit), and
    at registration if it already is; a level-triggered selector would report
    unread data on every call, a busy loop for a consumer that leaves it.
    """

    def __init__(self) -> None:
        self._epoll = select.epoll() if hasattr(select, "epoll") else None
        self._fallback = selectors.DefaultSelector() if self._epoll is None else None

    def register(self, fd: int) -> None:
        if self._epoll is not None:
            self._epoll.register(fd, select.EPOLLIN | select.EPOLLET)
        else:  # pragma: no cover - non-Linux
            assert self._fallback is not None
            self._fallback.register(fd, selectors.EVENT_READ)

    def unregister(self, fd: int) -> None:
        try:
            if self._epoll is not None:
                self._epoll.unregister(fd)
            else:  # pragma: no cover - non-Linux
                assert self._fallback is not None
                self._fallback.unregister(fd)
        except (KeyError, ValueError, OSError):  # already closed (epoll dropped it)
            pass

    def select(self, timeout: float | None) -> set[int]:
        """The fds that became readable, waiting up to ``timeout`` seconds."""
        if self._epoll is not None:
            try:
                wait = -1 if timeout is None else max(0.0, timeout)
                return {fd for fd, _ in self._epoll.poll(wait)}
            except InterruptedError:  # pragma: no cover - PEP 475 retries; be safe
                return set()
        assert self._fallback is not None  # pragma: no cover - non-Linux
        return {key.fd for key, _ in self._fallback.select(timeout)}  # pragma: no cover

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()
        elif self._fallback is not None:  # pragma: no cover - non-Linux
            self._fallback.close()


def _make_wake_fds() -> tuple[int, int]:
    if hasattr(os, "eventfd"):
        fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        return fd, fd
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    return read_fd, write_fd


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _close_selector(selector: _Selector, wake_fds: tuple[int, int]) -> None:
    selector.close()
    for fd in set(wake_fds):
        os.close(fd)


@runtime_checkable
class ReadinessSource(Protocol):
    """Anything a :class:`Waiter` can be attached to."""

    def attach(self, waiter: Waiter) -> None: ...

    def detach(self, waiter: Waiter) -> None: ...


class Signal:
    """Readiness reported by a thread: the producer calls :meth:`fire`.

    A signal is local to its process: pickling one gives a fresh signal with no
    waiters, so blocks holding signals can be sent to worker processes.
    """

    __slots__ = ("_lock", "_waiters")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: tuple[Waiter, ...] = ()

    def attach(self, waiter: Waiter) -> None:
        with self._lock:
            self._waiters = (*self._waiters, waiter)

    def detach(self, waiter: Waiter) -> None:
        with self._lock:
            waiters = list(self._waiters)
            if waiter in waiters:
                waiters.remove(waiter)
            self._waiters = tuple(waiters)

    def fire(self) -> None:
        """Wake every attached waiter."""
        for waiter in self._waiters:
            waiter.wake()

    def __reduce__(self):
        return (Signal, ())

    def __repr__(self) -> str:
        return f"Signal(waiters={len(self._waiters)})"


class FdReadiness:
    """Readiness of a file descriptor, e.g. the read end of a pipe."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def attach(self, waiter: Waiter) -> None:
        waiter.watch_fd(self.fd)

    def detach(self, waiter: Waiter) -> None:
        waiter.unwatch_fd(self.fd)

    def __repr__(self) -> str:
        return f"FdReadiness(fd={self.fd})"
