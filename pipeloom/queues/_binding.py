"""Which thread holds each end of an in-process queue.

An end binds to the first thread that uses it. Another thread using the same
end is a third endpoint and raises ``RuntimeError``. When a bound thread exits
(its thread-local data is freed), the queue hears about it through a callback,
so a peer blocked on the other end wakes up instead of hanging.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

from pipeloom.queues._base import Role

__all__ = ["ThreadBinding"]


class _ExitGuard:
    """Lives in a thread's thread-local data; dies when the thread exits."""

    __slots__ = ("__weakref__",)


class ThreadBinding:
    """Binds each role of one queue to one thread.

    Args:
        owner: a label for error messages, e.g. ``"ThreadQueue"``.
        on_exit: called as ``on_exit(role, thread_name)`` from the exiting
            thread when a bound thread ends.
    """

    def __init__(self, owner: str, on_exit: Callable[[Role, str], None]) -> None:
        self._owner = owner
        self._threads: dict[Role, tuple[int, str]] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._on_exit = on_exit

    def check(self, role: Role) -> None:
        """Bind ``role`` to the calling thread, or raise if another thread holds it."""
        me = threading.get_ident()
        bound = self._threads.get(role)
        if bound is not None and bound[0] == me:
            return
        with self._lock:
            bound = self._threads.get(role)
            if bound is None:
                name = threading.current_thread().name
                self._threads[role] = (me, name)
                self._watch_exit(role, name)
                return
        if bound[0] != me:
            verb = "put" if role == "producer" else "get"
            raise RuntimeError(
                f"{self._owner}: the {role} end is bound to thread {bound[1]!r}, but thread "
                f"{threading.current_thread().name!r} called {verb}(); a queue joins exactly "
                "two endpoints, so give each producer/consumer pair its own queue"
            )

    def _watch_exit(self, role: Role, name: str) -> None:
        guard = _ExitGuard()
        guards = getattr(self._local, "guards", None)
        if guards is None:
            guards = self._local.guards = []
        guards.append(guard)
        finalizer = weakref.finalize(guard, self._on_exit, role, name)
        finalizer.atexit = False
