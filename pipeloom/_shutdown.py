"""How loaders and their workers stop: ``with``, reference counting, never a forked copy.

Everything a loader starts -- worker processes, threads, queues -- stops when
``shutdown()`` is called, when a ``with`` block ends, or when the last
reference to the loader goes away. The last works by reference counting
alone (no reference cycles), so it is prompt even with the garbage collector
disabled; ``tests/own_resources.py`` finds a cycle that slips in.

A worker started with ``fork`` inherits a copy of every object of its parent,
the parent's loaders and pools included. If the worker's garbage collector
frees such a copy, its finalizer must do nothing: the processes, pipes and
queues it would stop belong to the parent. :func:`finalize_here` and
:class:`ShutsDown` run only in the process that created the object.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["ShutsDown", "created_here", "finalize_here"]


def finalize_here(obj: object, func: Callable[..., None], *args: Any) -> weakref.finalize:
    """``weakref.finalize(obj, func, *args)``, inert in a forked copy of this process.

    ``func`` runs once: when ``obj`` is freed, when the finalizer is called, or
    at interpreter exit -- and only in the process that called this function.
    ``func`` and ``args`` must not refer to ``obj`` (it would never be freed).

    Example:
        >>> class Pool:
        ...     pass
        >>> stopped = []
        >>> pool = Pool()
        >>> stop = finalize_here(pool, stopped.append, "stopped")
        >>> del pool  # reference counting runs it at once
        >>> stopped, stop.alive
        (['stopped'], False)
    """
    return weakref.finalize(obj, _run_in, os.getpid(), func, *args)


def _run_in(pid: int, func: Callable[..., None], *args: Any) -> None:
    if os.getpid() == pid:
        func(*args)


def created_here(pid: int) -> bool:
    """True in the process whose pid is ``pid`` (False in a forked copy of it)."""
    return os.getpid() == pid


class ShutsDown:
    """Mixin: ``with obj:`` and reference counting call ``obj.shutdown()``.

    ``shutdown`` must be idempotent (it may be called again when the object
    is freed). A forked copy of the object never calls it.

    Example:
        >>> class Job(ShutsDown):
        ...     running = True
        ...     def shutdown(self):
        ...         self.running = False
        >>> with Job() as job:
        ...     pass
        >>> job.running
        False
    """

    _creator_pid: int | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        obj = super().__new__(cls)
        obj.__dict__["_creator_pid"] = os.getpid()
        return obj

    def shutdown(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def __del__(self) -> None:
        if self._creator_pid is not None and not created_here(self._creator_pid):
            return  # a forked copy: the parent's workers are not ours to stop
        try:
            self._release()
        except Exception:  # interpreter shutdown: modules may be gone
            pass

    def _release(self) -> None:
        """What freeing the object does; ``shutdown()`` unless overridden."""
        self.shutdown()
