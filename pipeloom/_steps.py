"""One step of a loader at a time, so a checkpoint always falls between two items."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import Any, TypeVar

from .datapipes.runtime import cancel_interrupt, interrupt_waits
from .errors import StateError

__all__ = ["StepGate"]

_Method = TypeVar("_Method", bound=Callable[..., Any])
OnInterrupt = Callable[[bool], "BaseException | None"]  # see interrupt_waits


class StepGate:
    """One step of a loader at a time; another thread gets in within one step.

    The iterating thread holds ``lock`` during each step (an item and its
    count). Anything that needs the loader between two steps -- a checkpoint,
    a new epoch, a shutdown, from any thread -- runs in :meth:`between`. Locks
    are not fair, so a thread iterating in a tight loop could keep the others
    out indefinitely: they announce themselves in ``waiting`` first, and the
    iterating thread, seeing it before its next step, lets them in.

    Both locks are re-entrant: a signal handler runs in the main thread between
    any two lines, also while that thread holds ``_turn`` (in its own
    ``state_dict()``, ``iter()`` or before a step), and a handler that calls
    ``state_dict()`` there must get through, not wait for itself forever. It
    runs to its end before the interrupted code goes on, so the counts stay
    right.

    The thread holding ``lock`` (in a step or in :meth:`between`) records
    itself in ``stepper`` (:meth:`enter`), so a ``shutdown()`` from another
    thread wakes whichever thread holds the loader now (:meth:`waking`).

    Example:
        >>> gate = StepGate()
        >>> with gate.between():
        ...     gate.inside_a_step()
        True
        >>> gate.inside_a_step()
        False
    """

    __slots__ = ("lock", "waiting", "_turn", "deferred", "stepper", "_waking", "_woken", "_wake")

    _step_codes: set[CodeType] = set()  # the iterators' __next__, see step()

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.waiting = 0  # threads waiting in between()
        self._turn = threading.Condition(threading.RLock())
        self.deferred: list[Callable[[], object]] = []  # see defer()
        self.stepper = 0  # the id of the thread holding the loader (or that last held it)
        self._waking: OnInterrupt | None = None  # see waking()
        self._woken: set[int] = set()  # the threads it was sent to
        self._wake = threading.RLock()  # guards _waking and _woken (RLock: signal handlers)

    def enter(self) -> int:
        """Record this thread, which just took ``lock``, as the one holding the loader.

        Called by each step and by :meth:`between`; while a :meth:`waking` is in
        progress the thread's waits wake at once. Returns the thread's id.
        """
        self.stepper = thread = threading.get_ident()
        if self._waking is not None:  # read after stepper is set: see waking()
            with self._wake:
                if self._waking is not None:
                    self._woken.add(thread)
                    interrupt_waits(thread, self._waking)
        return thread

    @contextlib.contextmanager
    def waking(self, on_interrupt: OnInterrupt) -> Iterator[None]:
        """While the block runs, wake the waits of the thread holding the loader.

        That is the thread holding it now, and any thread that takes it
        meanwhile (the training loop's ``next()`` as a woken ``state_dict()``
        lets go): their waits raise what ``on_interrupt`` returns (see
        ``pipeloom.datapipes.runtime.interrupt_waits``). A thread that took
        the loader but has not recorded itself yet reads the request in
        :meth:`enter`. Requests no wait took are withdrawn at the end.
        """
        with self._wake:
            self._waking = on_interrupt
            self._woken.add(self.stepper)
            interrupt_waits(self.stepper, on_interrupt)
        try:
            yield
        finally:
            with self._wake:
                self._waking, woken, self._woken = None, self._woken, set()
            for thread in woken:
                cancel_interrupt(thread)

    @contextlib.contextmanager
    def between(self) -> Iterator[None]:
        """Hold the loader between two steps (waiting for the step in progress)."""
        with self._turn:
            self.waiting += 1
        try:
            with self.lock:
                self.enter()
                yield
        finally:
            with self._turn:
                self.waiting -= 1
                if not self.waiting:
                    self._turn.notify_all()
            if self.deferred:
                self.run_deferred()

    def defer(self, action: Callable[[], object]) -> None:
        """Run ``action`` when the step (or :meth:`between`) this thread is in ends.

        For a stop asked from inside one -- a signal handler that interrupted
        ``next()`` -- which must not wait for the locks the interrupted code
        holds (a queue's, a worker thread that waits for that queue). The
        step runs it as it returns or raises (``sys.exit()`` in the handler).
        """
        self.deferred.append(action)

    def run_deferred(self) -> None:
        """Run the deferred actions, once this thread is out of every step."""
        if self.lock._is_owned():  # type: ignore[attr-defined]  # an outer step goes on
            return
        while self.deferred:
            self.deferred.pop(0)()

    @classmethod
    def step(cls, method: _Method) -> _Method:
        """Mark an iterator's ``__next__`` (its ``self._steps`` is the gate) as a step.

        A signal handler can run after the step released the lock and before
        ``next()`` returns its item; :meth:`inside_a_step` finds the step's
        frame on the stack there, so the handler's ``state_dict()`` is refused
        (the item counted as delivered is lost if the handler raises).
        """
        cls._step_codes.add(method.__code__)
        return method

    def let_others_in(self) -> None:
        """Before a step: wait until the threads waiting in :meth:`between` are done."""
        if self.lock._is_owned():  # type: ignore[attr-defined]  # replay inside iter()
            return
        with self._turn:
            while self.waiting:
                self._turn.wait()

    def inside_a_step(self) -> bool:
        """True in the thread that holds the loader or runs its ``next()`` (a signal handler)."""
        if self.lock._is_owned():  # type: ignore[attr-defined]
            return True
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            if frame.f_code in self._step_codes:
                if getattr(frame.f_locals.get("self"), "_steps", None) is self:
                    return True
            frame = frame.f_back
        return False

    def refuse_inside_a_step(self, what: str) -> None:
        """Raise ``StateError`` when called from inside a step (no exact position exists)."""
        if self.inside_a_step():
            raise StateError(
                f"{what} was called from inside a step of this loader on the same thread (a "
                f"signal handler that interrupted this loader's next(), state_dict(), iter() "
                f"or load_state_dict(), or code running in a block): the loader is part-way "
                f"through one of them, so there is no exact position. "
                f"In a signal handler set a flag instead, and save the state in the training "
                f"loop before its next step"
            )
