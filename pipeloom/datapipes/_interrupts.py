"""Stopping another thread's wait for an item: ``shutdown()`` while ``next()`` waits.

A thread waiting in a :class:`~pipeloom.datapipes.BlockingReader` (the
training loop's ``next(loader)`` waiting on a stuck worker) sleeps on its
waiter until a readiness source fires, which a stuck worker never does. A
``shutdown()`` from another thread calls :func:`interrupt_waits` with that
thread's id: the thread's waits wake, and the first to see the request calls
``on_interrupt(between_items)`` and raises what it returns (None: the request
was not for this wait, which goes on). ``between_items``
is True for the reader that waits for the loader's next item
(``BlockingReader(..., between_items=True)``): nothing is part-way through an
item there, so the loader can still take an exact checkpoint in
``on_interrupt``. Waiting costs nothing more than a registration per wait.

Example:
    >>> import threading
    >>> from pipeloom.datapipes import BlockingReader, IterDataPipe, NotAvailable
    >>> from pipeloom.events import Signal
    >>> class Never(IterDataPipe):  # a source whose item never comes
    ...     def __init__(self):
    ...         self.signal = Signal()
    ...     def readiness_sources(self):
    ...         return [self.signal]
    ...     def async_next(self):
    ...         raise NotAvailable
    >>> def stop(between_items):
    ...     return RuntimeError(f"stopped (between items: {between_items})")
    >>> me = threading.get_ident()
    >>> threading.Timer(0.05, interrupt_waits, (me, stop)).start()
    >>> BlockingReader(Never(), between_items=True).next()
    Traceback (most recent call last):
    ...
    RuntimeError: stopped (between items: True)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from ..events import Waiter

__all__ = ["cancel_interrupt", "interrupt_waits", "raise_if_interrupted", "waiting"]

OnInterrupt = Callable[[bool], "BaseException | None"]

_LOCK = threading.Lock()
_WAITERS: dict[int, list[Waiter]] = {}  # thread id -> its waits in progress, innermost last
_PENDING: dict[int, OnInterrupt] = {}  # thread id -> what its next wait raises


def interrupt_waits(thread: int, on_interrupt: OnInterrupt) -> None:
    """Make thread ``thread``'s current or next wait raise ``on_interrupt(between_items)``."""
    with _LOCK:
        _PENDING[thread] = on_interrupt
        waiters = list(_WAITERS.get(thread, ()))
    for waiter in waiters:
        waiter.wake()


def cancel_interrupt(thread: int) -> None:
    """Withdraw a request no wait took (the step ended without waiting)."""
    with _LOCK:
        _PENDING.pop(thread, None)


@contextlib.contextmanager
def waiting(waiter: Waiter) -> Iterator[None]:
    """Register ``waiter`` as a wait of this thread while the block runs."""
    thread = threading.get_ident()
    with _LOCK:
        _WAITERS.setdefault(thread, []).append(waiter)
    try:
        yield
    finally:
        with _LOCK:
            waits = _WAITERS[thread]
            waits.remove(waiter)
            if not waits:
                del _WAITERS[thread]


def raise_if_interrupted(between_items: bool) -> None:
    """Raise what an :func:`interrupt_waits` for this thread asks (one wait takes it)."""
    if not _PENDING:  # the common case: one dict test, no lock
        return
    with _LOCK:
        on_interrupt = _PENDING.pop(threading.get_ident(), None)
    if on_interrupt is not None:
        error = on_interrupt(between_items)
        if error is not None:
            raise error
