"""What the test's own process tree holds: children, threads, fds, memfds; and reference cycles.

Tests judge only these, never the whole machine's ``/dev/shm`` or process
list (other jobs use them too). Waits are on events: a child's ``pidfd``
becomes readable when it exits, a thread is joined; nothing sleeps.

:func:`cycles_left_by` runs an action with the garbage collector disabled and
names the reference cycles it left, so a cycle that would keep a dropped
loader's workers alive until the next collection fails with a readable chain.
"""

from __future__ import annotations

import gc
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

__all__ = ["OwnResources", "cycles_left_by", "dropped", "memfds", "open_fds", "wait_for_exit"]


def open_fds() -> dict[int, str]:
    """This process's open descriptors and what each points to."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed since the listing (the listing's own fd, for one)
            pass
    return found


def memfds() -> dict[int, str]:
    """This process's descriptors of anonymous shared files (``memfd``)."""
    return {fd: target for fd, target in open_fds().items() if target.startswith("/memfd:")}


# multiprocessing's own helpers, started once per interpreter and kept on purpose
_SHARED_HELPERS = ("resource_tracker", "forkserver")


def _start_server() -> object | None:
    """pipeloom's start server (spawn), kept for the whole process on purpose, like those."""
    from pipeloom.reading_service.workers import start_server

    return start_server._server  # noqa: SLF001


def _shared_helper_fds() -> set[int]:
    """The fds this process keeps to multiprocessing's resource tracker and fork server,
    and to pipeloom's start server."""
    from multiprocessing import forkserver, resource_tracker

    tracker = getattr(resource_tracker, "_resource_tracker", None)
    server = getattr(forkserver, "_forkserver", None)
    fds = {getattr(tracker, "_fd", None), getattr(server, "_forkserver_alive_fd", None)}
    start = _start_server()
    if start is not None:
        fds.add(start._socket.fileno())  # type: ignore[attr-defined]  # noqa: SLF001
    return {fd for fd in fds if isinstance(fd, int)}


def _children() -> dict[int, psutil.Process]:
    found = {}
    start = _start_server()
    server_pid = None if start is None else start.pid  # type: ignore[attr-defined]
    for process in psutil.Process().children(recursive=True):
        if process.pid == server_pid:  # its templates (its children) still count
            continue
        try:
            command = " ".join(process.cmdline())
        except psutil.Error:  # exited meanwhile (or a zombie): still ours to account for
            command = ""
        if not any(helper in command for helper in _SHARED_HELPERS):
            found[process.pid] = process
    return found


@dataclass
class _Left:
    children: list[str]
    threads: list[str]
    fds: dict[int, str]

    def __bool__(self) -> bool:
        return bool(self.children or self.threads or self.fds)


class OwnResources:
    """A snapshot of this process tree's children, threads and fds; compare later.

    Example (no resources made between snapshot and check):
        >>> OwnResources().left_after(timeout=1.0).children
        []
    """

    def __init__(self) -> None:
        self.children = set(_children())
        self.threads = {t.ident for t in threading.enumerate()}
        self.fds = open_fds()

    def left_after(self, timeout: float) -> _Left:
        """What is still alive that was not at the snapshot, after waiting up to ``timeout``.

        Waits for new children to exit (on their pidfds) and new threads to end
        (joins), then compares the fds. A zombie child (exited, not reaped)
        counts as left: the loader should have reaped it.
        """
        deadline = time.monotonic() + timeout
        new = [p for pid, p in _children().items() if pid not in self.children]
        _wait_exits([p.pid for p in new], deadline)
        for thread in threading.enumerate():
            if thread.ident not in self.threads and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        children = []
        for pid, process in _children().items():
            if pid not in self.children:
                try:
                    children.append(f"pid {pid} {process.name()!r} ({process.status()})")
                except psutil.NoSuchProcess:
                    pass
        threads = [
            t.name for t in threading.enumerate() if t.ident not in self.threads and t.is_alive()
        ]
        now = open_fds()
        helpers = _shared_helper_fds()
        fds = {
            fd: target
            for fd, target in now.items()
            if self.fds.get(fd) != target and fd not in helpers
        }
        return _Left(children, threads, fds)

    def assert_released(self, timeout: float = 10.0) -> None:
        left = self.left_after(timeout)
        assert not left, (
            f"left behind: children {left.children}, threads {left.threads}, fds {left.fds}"
        )


def wait_for_exit(pids: list[int], timeout: float) -> list[int]:
    """Wait (on pidfds) until the processes ``pids`` exited; return those still running.

    A zombie (exited, not yet reaped by its parent) counts as exited.
    """
    _wait_exits(pids, time.monotonic() + timeout)
    running = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.NoSuchProcess:
            pass
    return running


def _wait_exits(pids: list[int], deadline: float) -> None:
    """Wait (on pidfds, no polling) until every process of ``pids`` exited or ``deadline``."""
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except OSError:  # already gone
            pass
    try:
        waiting = list(fds)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            ready, _, _ = select.select(waiting, [], [], left)
            waiting = [fd for fd in waiting if fd not in ready]
    finally:
        for fd in fds:
            os.close(fd)


def dropped(
    action: Callable[[], None], timeout: float = 10.0, module_prefix: str = "pipeloom"
) -> tuple[_Left, list[str]]:
    """What ``action`` left alive, and the cycles it left, with the garbage collector off.

    ``action`` makes objects and drops them: with no reference cycle,
    reference counting alone must release their processes, threads and fds.
    """
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        before = OwnResources()
        action()
        left = before.left_after(timeout)
        cycles = _garbage_cycles(module_prefix)
    finally:
        if enabled:
            gc.enable()
    return left, cycles


def cycles_left_by(
    action: Callable[[], None], module_prefix: str | tuple[str, ...] = "pipeloom"
) -> list[str]:
    """Run ``action`` with gc disabled; describe the cycles of ``module_prefix`` objects it left
    (a tuple: objects of any of those modules).

    Each entry is a chain of references inside the garbage (``A -> B -> A``),
    so the attribute that closes the cycle is easy to find. Empty: no cycle.
    """
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        action()
        return _garbage_cycles(module_prefix)
    finally:
        if enabled:
            gc.enable()


def _garbage_cycles(module_prefix: str | tuple[str, ...]) -> list[str]:
    """Collect now (saving the garbage) and describe the cycles of ``module_prefix`` objects."""
    flags = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
    finally:
        gc.set_debug(flags)
    garbage = list(gc.garbage)
    gc.garbage.clear()
    ids = {id(obj) for obj in garbage}
    ours = [obj for obj in garbage if type(obj).__module__.startswith(module_prefix)]
    described: list[str] = []
    for obj in ours:  # the objects on a cycle first: they are what to fix
        chain = _cycle_through(obj, ids)
        if chain is not None and chain not in described:
            described.append(chain)
        if len(described) == 5:
            break
    if not described:
        described = [f"{_name(obj)} (held by a cycle, not on one)" for obj in ours[:5]]
    del garbage, ours
    obj = None  # noqa: F841 - drop the loop's last reference before collecting
    gc.collect()  # the saved garbage, now without DEBUG_SAVEALL: its finalizers run
    return described


def _cycle_through(start: object, garbage: set[int]) -> str | None:
    """The shortest chain ``A -> B -> ... -> A`` of references inside the garbage."""
    parents: dict[int, object] = {}
    frontier = [start]
    found = None
    while frontier and found is None:
        following = []
        for obj in frontier:
            for ref in gc.get_referents(obj):
                if id(ref) not in garbage or id(ref) in parents:
                    continue
                parents[id(ref)] = obj
                if ref is start:
                    found = obj
                    break
                following.append(ref)
            if found is not None:
                break
        frontier = following
    if found is None:
        return None
    chain = [start]
    current = found
    while current is not start:
        chain.append(current)
        current = parents[id(current)]
    return " -> ".join(_name(obj) for obj in [start, *reversed(chain[1:]), start])


def _name(obj: object) -> str:
    kind = type(obj)
    if kind is dict:
        return f"dict({', '.join(list(map(str, obj))[:4])})"  # type: ignore[call-overload]
    if kind in (list, tuple):
        return f"{kind.__name__}[{len(obj)}]"  # type: ignore[arg-type]
    return f"{kind.__module__}.{kind.__qualname__}"
