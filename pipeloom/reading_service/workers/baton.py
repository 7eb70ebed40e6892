"""A pool-level GIL baton: worker threads take turns running Python while they are GIL-bound.

Worker threads whose work holds the GIL (pure Python, small torch calls) run
one at a time anyway; but ``torch.tensor`` and ``torch.stack`` release the
GIL for a moment, and then the threads hand the GIL to each other every few
items (each hand-over is a sleep and a wake-up). With the baton a worker
thread produces only while it holds the baton and gives it to the next
waiting worker around each ``put``: the others sleep on the baton, not on
the GIL, so the GIL changes hands about once per output.

Used always it would serialize what threads are for (I/O waits, GIL-free C
work), so in ``"auto"`` mode the pool measures, per window (at least
:data:`WINDOW_S` of wall time and :data:`PUTS_PER_WORKER` puts per worker,
closed at a put), the worker threads' CPU (each thread's CPU clock) and
outputs per second, and tries the baton against going without:

* off -> on (a try): :data:`EVIDENCE` windows in a row in which the worker
  threads together used at least :data:`BUSY_CORES` cores of CPU (they
  mostly compute, not wait). There is no upper bound: threads that hand the
  GIL to each other every few items burn CPU doing it (1.2-1.7 cores on 2
  cores measured with 4 threads on cheap items), so CPU above 1 core does
  not show that the work runs in parallel; only the try shows it;
* on -> off: the first window of a try put out fewer outputs per second than
  the window before it without (below :data:`SLOWER` of it: the threads ran
  GIL-free work side by side, e.g. Pillow decoding; the try may still cost
  less CPU per output, but throughput is what threads are for), or in any
  window the holders computed less
  than :data:`HOLDER_BUSY` of the time they held the baton (they blocked:
  sleep, a socket read), or the workers used less than :data:`BUSY_CORES`.
  After a failed try the pool waits :data:`FIRST_HOLD_OFF` windows, twice as
  many after each failure in a row (up to :data:`MAX_HOLD_OFF`). After
  :data:`RECHECK` windows on, one window runs without it, and the next is a
  try against that window again; each such try that keeps it doubles the
  wait for the next (up to :data:`MAX_RECHECK`).

An epoch's first window (its threads start) and a window in which a worker
thread ended are not judged, nor one in which the workers used less than
:data:`BUSY_CORES` while a put waited on a full queue (the consumer set the
pace, not the work).

A holder that blocks holds the others back until its next output, once per try.
The baton changes only which thread runs when: outputs, their order, errors
and resume are the same. Modes: ``"auto"``, ``"on"`` (always, e.g. to
measure it) and ``"off"`` (never; the workers then never touch it); the
default comes from the ``PIPELOOM_GIL_BATON`` environment variable, else
``"auto"``. Per-thread CPU is read with ``time.pthread_getcpuclockid``;
where that is missing, ``"auto"`` stays off. On a free-threaded Python
running without the GIL (3.13t/3.14t) there is no GIL to hand over:
``"auto"`` is ``"off"`` there (measured on 3.14t, cheap items, 2 threads:
1.47x in-process without the baton, 1.26x with ``"auto"``, 0.90x with ``"on"``).
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Literal, cast

__all__ = [
    "ENV_VAR",
    "MODES",
    "BatonMode",
    "BatonPolicy",
    "BatonStatistics",
    "GilBaton",
    "Seat",
    "Window",
    "gil_enabled",
    "resolve_mode",
]

BatonMode = Literal["auto", "on", "off"]
MODES: tuple[BatonMode, ...] = ("auto", "on", "off")
ENV_VAR = "PIPELOOM_GIL_BATON"

WINDOW_S = 0.02
"""Shortest measuring window, seconds of wall time (a window closes at a put).

Long enough to hold tens of outputs of decoding work (a JPEG's 0.4-0.8 ms), whose
rate in a 5 ms window was too noisy to see that the baton halved it."""
BUSY_CORES = 0.3
"""Below this the workers mostly wait (I/O, sleep): the baton would only serialize the waits."""
HOLDER_BUSY = 0.3
"""The holders' CPU over the wall time they held the baton below this: they blocked; off.

Low on purpose: on a loaded machine a computing holder also loses CPU to other
processes (about 0.4 of its hold at load 5 on 2 cores); work that blocks only
part of the time is caught by the try's outputs per second instead."""
MIN_HOLD_S = 0.002
"""Holds adding up to less than this in a window are too short to judge the holders by."""
SLOWER = 0.85
"""Outputs/s with the baton below this fraction of the rate without: baton off."""
RECHECK = 20
"""Windows on before the first re-measure without the baton; each re-measure that keeps it
doubles the next wait (up to :data:`MAX_RECHECK`): a window without it can itself fall
into the hand-overs (measured: 20 ms instead of 8), so re-measuring often costs."""
MAX_RECHECK = 640
"""Most windows on between re-measures without the baton."""
EVIDENCE = 3
"""Busy windows in a row, without the baton, before trying it.

A try of work that blocks while holding (I/O and CPU mixed) costs about one
window at a lower rate; 3 windows (60 ms) let the first epoch of a short job
decide (an epoch of 20,000 cheap items lasts about 80 ms)."""
FIRST_HOLD_OFF = 4
"""Windows to wait after a first failed try; each failure in a row doubles it."""
MAX_HOLD_OFF = 1024
"""Most windows to wait before trying the baton again."""
PUTS_PER_WORKER = 2
"""A window also lasts at least this many puts per worker thread."""


def gil_enabled() -> bool:
    """Whether this interpreter runs with the GIL (a free-threaded build may run without)."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


def resolve_mode(mode: str | None) -> BatonMode:
    """``mode``, or the ``PIPELOOM_GIL_BATON`` environment variable when None, checked."""
    source = "gil_baton"
    if mode is None:
        mode, source = os.environ.get(ENV_VAR, "auto"), ENV_VAR
    if mode not in MODES:
        raise ValueError(
            f"{source} must be one of {', '.join(repr(m) for m in MODES)}, got {mode!r}; "
            "use 'auto' to let the pool measure when worker threads should take turns"
        )
    return cast(BatonMode, mode)


@dataclass(frozen=True)
class Window:
    """What the worker threads did over one measuring window."""

    wall: float  # seconds
    cpu: float  # the worker threads' CPU, seconds, summed
    puts: int  # outputs put
    waited: bool  # a put waited on a full queue (the consumer is behind)
    complete: bool = True  # every worker thread's CPU could be read
    held_wall: float = 0.0  # seconds the baton was held (holds given in the window)
    held_cpu: float = 0.0  # the holders' CPU while they held it


@dataclass(frozen=True)
class BatonStatistics:
    """Counters of a pool's baton (over the loader's life)."""

    mode: BatonMode
    on: bool
    windows: int  # windows judged
    switched_on: int
    switched_off: int
    blocked_holders: int  # switch-offs because a holder blocked while holding it
    hand_overs: int  # takes that waited for another worker to give it


class BatonPolicy:
    """When the baton is on: a pure state machine fed with windows (no clocks, no threads)."""

    def __init__(self, mode: BatonMode = "auto") -> None:
        self.mode: BatonMode = "off" if mode == "auto" and not gil_enabled() else mode
        self.on = mode == "on"
        self.rate_off: float | None = None  # outputs/s in the last window without
        self.trying = False  # the next judged window is the first with the baton
        self.evidence = 0  # GIL-bound windows in a row without the baton
        self.needed = EVIDENCE  # how many it takes to try (1 after a re-measure)
        self.hold_off = 0  # windows to wait before trying again
        self.backoff = FIRST_HOLD_OFF
        self.windows_on = 0
        self.recheck = RECHECK  # windows on before the next re-measure
        self.rechecking = False  # the current try follows a re-measure
        self.windows = 0
        self.switched_on = 0
        self.switched_off = 0
        self.blocked_holders = 0
        self.hand_overs = 0
        self._lock = threading.Lock()

    def observe(self, window: Window) -> bool:
        """Judge one window; returns whether the baton is on after it."""
        if self.mode != "auto":
            return self.on
        with self._lock:
            if not window.complete or window.wall <= 0:
                return self.on  # no verdict: a worker thread ended
            cores = window.cpu / window.wall
            rate = window.puts / window.wall
            idle = cores < BUSY_CORES
            if idle and window.waited:
                return self.on  # no verdict: the workers waited for the consumer
            self.windows += 1
            if not self.on:
                self.evidence = 0 if idle else self.evidence + 1
                if self.hold_off > 0:
                    self.hold_off -= 1
                elif self.evidence >= self.needed:
                    self.rate_off, self.trying, self.needed = rate, True, EVIDENCE
                    self._switch(True)
                elif idle:
                    self.needed = EVIDENCE
            elif idle or (
                window.held_wall >= MIN_HOLD_S and window.held_cpu < HOLDER_BUSY * window.held_wall
            ):
                self.blocked_holders += 1  # the holders waited (I/O, sleep) while holding it
                self._fail()
            elif self.trying:
                self.trying = False
                if self.rate_off is not None and rate < SLOWER * self.rate_off:
                    self._fail()
                else:
                    self.backoff = FIRST_HOLD_OFF
                    if self.rechecking:  # kept again: re-measure less often
                        self.recheck = min(2 * self.recheck, MAX_RECHECK)
                self.rechecking = False
            else:
                self.windows_on += 1
                if self.windows_on >= self.recheck:  # one window without it, to measure again
                    self.needed, self.rechecking = 1, True
                    self._switch(False)
            return self.on

    def _fail(self) -> None:
        self.trying = self.rechecking = False
        self.recheck = RECHECK
        self.evidence = 0
        self.needed = 1  # busy already shown: try again once the hold-off is over
        self.hold_off = self.backoff
        self.backoff = min(2 * self.backoff, MAX_HOLD_OFF)
        self._switch(False)

    def _switch(self, on: bool) -> None:
        self.on = on
        self.windows_on = 0
        if on:
            self.switched_on += 1
        else:
            self.switched_off += 1

    def statistics(self) -> BatonStatistics:
        return BatonStatistics(
            mode=self.mode,
            on=self.on,
            windows=self.windows,
            switched_on=self.switched_on,
            switched_off=self.switched_off,
            blocked_holders=self.blocked_holders,
            hand_overs=self.hand_overs,
        )


class Seat:
    """One worker thread's place at the baton: whether it holds it, and since when."""

    __slots__ = ("clock", "held", "since_cpu", "since_wall")

    def __init__(self, clock: int | None) -> None:
        self.clock = clock  # the thread's CPU clock id
        self.held = False
        self.since_wall = 0.0
        self.since_cpu = 0.0


class _Turn:
    """A worker waiting for the baton: released when it is given to it (or the baton stops)."""

    __slots__ = ("given", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.given = False


class GilBaton:
    """One epoch's baton for a pool's worker threads (the policy outlives it).

    Each worker thread calls :meth:`join` once, then :meth:`take` before it
    produces and :meth:`give` before each ``put`` (then :meth:`put_done` and
    :meth:`take` after it). :meth:`close` (at the epoch's end or on stop)
    lets every waiting worker go and makes later takes return at once.

    Example:
        >>> baton = GilBaton(BatonPolicy("on"))
        >>> seat = baton.join()
        >>> baton.take(seat); seat.held
        True
        >>> baton.give(seat); seat.held
        False
    """

    def __init__(self, policy: BatonPolicy) -> None:
        self.policy = policy
        self._lock = threading.Lock()
        self._busy = False  # a worker holds it
        self._turns: collections.deque[_Turn] = collections.deque()
        self._closed = False
        self._seats: list[Seat] = []
        self._window_wall = time.monotonic()
        self._window_cpu = 0.0
        self._window_puts = 0
        self._window_waited = False
        self._held_wall = 0.0  # wall and CPU time of the holds given this window
        self._held_cpu = 0.0
        self._started = False  # the epoch's first window (threads starting) is not judged

    def join(self) -> Seat:
        """Register the calling worker thread (its CPU clock is read at each window's end)."""
        clock = None
        if hasattr(time, "pthread_getcpuclockid"):
            clock = time.pthread_getcpuclockid(threading.get_ident())
        seat = Seat(clock)
        with self._lock:
            self._seats.append(seat)
            if clock is None and self.policy.mode == "auto":
                self.policy.mode = "off"  # cannot measure: never on
                self.policy.on = False
            if len(self._seats) == 1:
                self._window_wall = time.monotonic()
            self._window_cpu -= _cpu(clock)
        return seat

    def take(self, seat: Seat) -> None:
        """Wait for the baton when it is on (at once when off or closed)."""
        if not self.policy.on or self._closed:
            return
        with self._lock:
            if not self.policy.on or self._closed:
                return
            if not self._busy:
                self._busy = True
                turn = None
            else:
                turn = _Turn()
                self._turns.append(turn)
        if turn is not None:
            turn.lock.acquire()  # given by the holder, or released by a switch-off/close
            if not turn.given:
                return
        seat.held = True
        seat.since_wall = time.monotonic()
        seat.since_cpu = time.thread_time()

    def give(self, seat: Seat) -> None:
        """Give the baton to the next waiting worker (or free it), if ``seat`` holds it."""
        if not seat.held:
            return
        seat.held = False
        held_wall = time.monotonic() - seat.since_wall
        held_cpu = time.thread_time() - seat.since_cpu
        with self._lock:
            self._held_wall += held_wall
            self._held_cpu += held_cpu
            if self._turns and self.policy.on and not self._closed:
                turn = self._turns.popleft()
                turn.given = True
                self.policy.hand_overs += 1
                turn.lock.release()  # the baton passes straight to it: still busy
            else:
                self._busy = False
                self._release_all()

    def put_done(self, waited: bool) -> None:
        """Count a put (``waited``: it waited on a full queue); judge the window when it is over."""
        if self.policy.mode != "auto":
            return
        now = time.monotonic()
        with self._lock:
            self._window_puts += 1
            self._window_waited |= waited
            if now - self._window_wall < WINDOW_S or self._window_puts < PUTS_PER_WORKER * len(
                self._seats
            ):
                return
            cpu, complete = 0.0, True
            for seat in self._seats:
                try:
                    cpu += _cpu(seat.clock)
                except OSError:  # the thread ended
                    complete = False
            window = Window(
                wall=now - self._window_wall,
                cpu=cpu + self._window_cpu,
                puts=self._window_puts,
                waited=self._window_waited,
                complete=complete and self._started,
                held_wall=self._held_wall,
                held_cpu=self._held_cpu,
            )
            self._window_wall, self._window_cpu, self._started = now, -cpu, True
            self._held_wall = self._held_cpu = 0.0
            self._window_puts, self._window_waited = 0, False
            if not self.policy.observe(window):
                self._release_all()

    def close(self) -> None:
        """Let every waiting worker go; later takes return at once. Idempotent."""
        with self._lock:
            self._closed = True
            self._release_all()

    def _release_all(self) -> None:
        while self._turns:
            self._turns.popleft().lock.release()  # not given: the waiter runs without it

    @property
    def waiting(self) -> int:
        """Workers waiting for the baton now."""
        return len(self._turns)


def _cpu(clock: int | None) -> float:
    return 0.0 if clock is None else time.clock_gettime(clock)
