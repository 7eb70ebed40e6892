"""Watching the other process: readiness fds, exit descriptions, waiting.

When an end learns its peer's pid (from the peer's hello frame), it opens a
``pidfd`` for it: the descriptor becomes readable when the peer exits, so a
blocked call wakes at once even when a forked sibling still holds a copy of
the peer's socket (which would hide the end-of-file).
"""

from __future__ import annotations

import os
import select
import weakref

from pipeloom._exit_status import signal_text
from pipeloom.events import Waiter

__all__ = ["FdSetReadiness", "describe_exit", "open_pidfd", "wait_readable"]


def wait_readable(fds: list[int], timeout: float | None) -> list[int]:
    """Block until one of ``fds`` is readable; returns those that are ([] on timeout)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    millis = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
    return [fd for fd, _ in poller.poll(millis)]


def is_readable(fd: int) -> bool:
    return bool(wait_readable([fd], 0))


def open_pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (None if unsupported)."""
    if not hasattr(os, "pidfd_open"):  # pragma: no cover - Linux < 5.3 / other OS
        return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None  # already gone and reaped; the socket's EOF will tell
    except OSError:  # pragma: no cover
        return None


_EXIT_GRACE = 1.0  # seconds to wait for a peer whose socket closed to finish exiting


def _exit_status(pid: int):
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError):
        return None


def describe_exit(role: str, pid: int | None) -> str:
    """E.g. ``"producer process 1234 was killed by signal 9 (SIGKILL)"``."""
    if pid is None:
        return f"the {role} process exited or closed its end without closing the queue"
    info = _exit_status(pid)
    if info is None:
        # The peer's socket closes during its exit, a moment before the kernel
        # publishes its status: wait (on its pidfd, briefly) for the exit to finish.
        pidfd = open_pidfd(pid)
        if pidfd is not None:
            try:
                wait_readable([pidfd], _EXIT_GRACE)
            finally:
                os.close(pidfd)
            info = _exit_status(pid)
    if info is None:
        return f"{role} process {pid} exited without closing the queue"
    if info.si_code == os.CLD_EXITED:
        return f"{role} process {pid} exited with code {info.si_status} without closing the queue"
    return f"{role} process {pid} was killed by {signal_text(info.si_status)}"


class FdSetReadiness:
    """A readiness source made of several fds (socket, wake-up fd, peer pidfd).

    It remembers the waiters attached to it, so fds added later are watched
    too, and :meth:`close` unwatches them before the fds are closed.
    """

    def __init__(self, fds: list[int]) -> None:
        self._fds = list(fds)
        self._waiters: weakref.WeakSet[Waiter] = weakref.WeakSet()

    def attach(self, waiter: Waiter) -> None:
        self._waiters.add(waiter)
        for fd in self._fds:
            waiter.watch_fd(fd)

    def detach(self, waiter: Waiter) -> None:
        if waiter in self._waiters:
            self._waiters.discard(waiter)
            for fd in self._fds:
                waiter.unwatch_fd(fd)

    def add_fd(self, fd: int) -> None:
        self._fds.append(fd)
        for waiter in list(self._waiters):
            waiter.watch_fd(fd)

    def close(self) -> None:
        for waiter in list(self._waiters):
            self.detach(waiter)
        self._fds = []

    def __repr__(self) -> str:
        return f"FdSetReadiness(fds={self._fds})"
