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

A stop runs to its end once started, even when Ctrl-C arrives in the middle
(a stop that ran part-way would leave workers running, and one that believed
it had run would not run again): :class:`Steps` runs every step of a stop
whatever an earlier one raised, then raises the first error; a finalizer of
:func:`finalize_here` (how worker processes are stopped) holds Ctrl-C back
while it runs (:func:`interrupts_held`) and delivers it when done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import weakref
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import Any

__all__ = ["ShutsDown", "Steps", "created_here", "finalize_here", "interrupts_held"]


def finalize_here(obj: object, func: Callable[..., None], *args: Any) -> weakref.finalize:
    """``weakref.finalize(obj, func, *args)``, inert in a forked copy of this process.

    ``func`` runs once: when ``obj`` is freed, when the finalizer is called, or
    at interpreter exit -- and only in the process that called this function.
    ``func`` and ``args`` must not refer to ``obj`` (it would never be freed).
    Ctrl-C arriving while ``func`` runs is delivered once it returned
    (:func:`interrupts_held`): the finalizer is spent as soon as it is
    called, so ``func`` must not be cut short.

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
        with interrupts_held():
            func(*args)


_holding = False  # a block of interrupts_held() runs in the main thread


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back while the block runs; then run its handler.

    For code that must not be cut short (a stop that kills and reaps worker
    processes). Only the main thread receives signals, so elsewhere (and
    where SIGINT has no Python handler) the block runs as it is. Holding is
    cheap; keep the block bounded in time, since Ctrl-C cannot end it.

    Example:
        >>> with interrupts_held():
        ...     pass
    """
    global _holding
    if _holding or threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        handler = signal.getsignal(signal.SIGINT)
    except ValueError:  # not the main interpreter
        handler = None
    if not callable(handler):  # SIG_IGN, SIG_DFL, or not set from Python
        yield
        return
    arrived: list[tuple[int, FrameType | None]] = []
    signal.signal(signal.SIGINT, lambda signum, frame: arrived.append((signum, frame)))
    _holding = True
    try:
        yield
    finally:
        _holding = False
        signal.signal(signal.SIGINT, handler)
        if arrived:
            handler(*arrived[0])  # default_int_handler raises KeyboardInterrupt


class Steps:
    """Run each step of a stop even if an earlier one raised; then raise the first error.

    A stop cut short by Ctrl-C (or any error) in one step would leave the
    next steps' workers running: each step gets its turn, a step that Ctrl-C
    cut short gets a second one, and the first exception
    (``KeyboardInterrupt`` included) propagates once all ran.

    Example:
        >>> done = []
        >>> def fail():
        ...     raise KeyboardInterrupt
        >>> try:
        ...     with Steps() as steps:
        ...         steps.run(fail)
        ...         steps.run(done.append, "second step")
        ... except KeyboardInterrupt:
        ...     done
        ['second step']
    """

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def run(self, func: Callable[..., object], *args: Any) -> None:
        """``func(*args)``; an exception it raises is kept for the end of the block.

        A step cut short by Ctrl-C runs once more (steps are idempotent), so
        what it stops is stopped; ``KeyboardInterrupt`` is raised at the end.
        """
        for again in (True, False):
            try:
                func(*args)
                return
            except KeyboardInterrupt as error:
                self._keep(error)
                if not again:
                    return
            except BaseException as error:  # noqa: BLE001 - raised again at the end of the block
                self._keep(error)
                return

    def _keep(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error

    def __enter__(self) -> Steps:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error


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
