"""The plan's queues as the consumer saw them: occupancy when it asked, bytes moved, shared memory.

Every queue keeps its counters in one place both ends see (a thread queue
in memory, a process queue in its shared control block), so the main
process reads any queue's :meth:`~pipeloom.queues.DataLoaderQueue.statistics`
without a message from the workers. :class:`QueueWatch` reads them when the
consumer calls ``next(loader)`` (at most every :data:`PERIOD` seconds):
occupancy at the moment the training loop asks for data is what decides
whether it waits (SPDL calls it data readiness).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._sampler import WINDOW as WINDOW_S
from ._sampler import window_of

__all__ = ["PERIOD", "QueueStats", "QueueWatch", "queue_lines", "queue_verdict"]

PERIOD = 0.01
"""Seconds between two samples of the queues (at the consumer's ``next()`` calls)."""
EMPTY_VERDICT = 0.9
"""A queue to the main process empty this often explains a loader-bound wait."""


@dataclass(frozen=True)
class QueueStats:
    """One queue of the running plan, sampled when the consumer asked for an output.

    Attributes:
        name: which queue, e.g. ``"worker process 0 -> main"``.
        kind: its implementation (``"thread"``, ``"process"``).
        capacity: messages it holds before ``put`` waits.
        samples: how many times it was read.
        mean_fill: its mean occupancy as a share of ``capacity``.
        empty_share: share of the samples it was empty.
        full_share: share of the samples it was full.
        messages: messages put through it, from its start to its end (or now).
        bytes_moved: payload bytes that crossed it (a thread queue passes
            references: 0).
        bytes_via_shm: the part of ``bytes_moved`` that went through shared memory.
        shm_held_mib: shared memory its producer holds at the last sample.
        shm_peak_mib: the most shared memory its producer held at a sample.
        timeline: ``(seconds since statistics started, mean fill)`` per window
            (the last hour of a longer run).
    """

    name: str
    kind: str
    capacity: int
    samples: int
    mean_fill: float
    empty_share: float
    full_share: float
    messages: int
    bytes_moved: int
    bytes_via_shm: int
    shm_held_mib: float
    shm_peak_mib: float
    timeline: tuple[tuple[float, float], ...] = field(default=())


class _Track:
    """What one queue name accumulated (its queue objects may change: new threads per epoch)."""

    def __init__(self, kind: str, capacity: int) -> None:
        self.kind, self.capacity = kind, capacity
        self.samples = self.fill = self.empty = self.full = 0.0
        self.messages = self.moved = self.via_shm = 0
        self.held = self.peak = 0
        # id(queue) -> (the queue, weakly; its (puts, inline bytes, shm bytes) at the last sample)
        self.last: dict[int, tuple[Any, tuple[int, int, int]]] = {}
        self.windows: dict[int, list[float]] = {}  # window -> [fill sum, samples]


class QueueWatch:
    """Reads ``queues()`` (``ReadingService.queues``) at most every ``period`` seconds.

    Example:
        >>> from pipeloom.queues import ThreadQueue
        >>> queue = ThreadQueue(capacity=2)
        >>> queue.put("x")
        >>> watch = QueueWatch(lambda: [("a -> main", queue)], period=0.0)
        >>> watch.sample()
        >>> [(q.name, q.mean_fill, q.messages) for q in watch.summary(window=1.0)]
        [('a -> main', 0.5, 1)]
    """

    def __init__(
        self,
        queues: Callable[[], Sequence[tuple[str, Any]]],
        *,
        period: float = PERIOD,
        started: float | None = None,
    ) -> None:
        self._queues = queues
        self._period = period
        self._next = 0.0
        self._started = time.perf_counter() if started is None else started  # timeline's 0
        self._tracks: dict[str, _Track] = {}
        # The queues read since release(): read again by count() after the service let
        # them go (a finished epoch's, a retired configuration's), for their last messages.
        self._held: dict[int, tuple[str, Any]] = {}
        # The consumer samples and counts; stats() may count and sum up from another thread.
        self._lock = threading.RLock()

    def maybe_sample(self, now: float) -> None:
        """Sample when ``period`` passed since the last sample (``now``: ``perf_counter``)."""
        if now >= self._next:
            self._next = now + self._period
            self.sample(now)

    def sample(self, now: float | None = None) -> None:
        """Read every queue once; a queue that cannot answer (stopped) is left out."""
        now = time.perf_counter() if now is None else now
        window = int((now - self._started) // WINDOW_S)
        try:
            queues = list(self._queues())
        except Exception:  # noqa: BLE001 - statistics never break the loader
            return
        with self._lock:
            self._sample(queues, window)

    def _sample(self, queues: list[tuple[str, Any]], window: int) -> None:
        for name, queue in queues:
            try:
                stats = queue.statistics()
            except Exception:  # noqa: BLE001 - a queue being closed meanwhile
                continue
            track = self._count(name, queue, stats)
            fill = min(stats.qsize, stats.capacity) / stats.capacity if stats.capacity else 0.0
            track.samples += 1
            track.fill += fill
            track.empty += stats.qsize <= 0
            track.full += stats.qsize >= stats.capacity
            track.held = stats.shm_bytes_held
            track.peak = max(track.peak, stats.shm_bytes_held)
            slot = window_of(track.windows, window, _pair)
            slot[0] += fill
            slot[1] += 1

    def count(self) -> None:
        """Add what crossed every queue since it was last read, without a fill sample.

        Called where queues may stop being read: an epoch's end, before autotune
        retires a configuration's workers, ``stats()``. (Messages put after a
        queue's last periodic sample were lost: a fast loop's 100 batches were
        reported as some 50 messages.)
        """
        try:
            queues = list(self._queues())
        except Exception:  # noqa: BLE001 - statistics never break the loader
            queues = []
        current = {id(queue) for _, queue in queues}
        with self._lock:
            held = [q for i, q in self._held.items() if i not in current]
            for name, queue in queues + held:
                try:
                    stats = queue.statistics()
                except Exception:  # noqa: BLE001 - a queue being closed meanwhile
                    continue
                self._count(name, queue, stats)

    def release(self) -> None:
        """Let go of the queues read so far (an epoch ended; :meth:`count` read them last)."""
        with self._lock:
            self._held.clear()

    def _count(self, name: str, queue: Any, stats: Any) -> _Track:
        """``name``'s track, with the messages and bytes ``queue`` moved since last read."""
        track = self._tracks.get(name)
        if track is None:
            track = self._tracks[name] = _Track(stats.kind, stats.capacity)
        counted = (stats.puts, stats.bytes_inline, stats.bytes_via_shm)
        ref, before = track.last.get(id(queue), (None, (0, 0, 0)))
        if ref is None or ref() is not queue:  # a new queue: counted from its start
            ref, before = weakref.ref(queue), (0, 0, 0)
        track.last[id(queue)] = (ref, counted)
        self._held[id(queue)] = (name, queue)
        track.messages += max(0, counted[0] - before[0])
        track.moved += max(0, counted[1] - before[1]) + max(0, counted[2] - before[2])
        track.via_shm += max(0, counted[2] - before[2])
        return track

    def summary(self, *, window: float | None = None) -> tuple[QueueStats, ...]:
        """One record per queue name, in the order they were first seen."""
        self.count()
        with self._lock:
            tracks = list(self._tracks.items())
        size = WINDOW_S if window is None else window
        result = []
        for name, t in tracks:
            n = t.samples or 1
            timeline = tuple(
                (w * size, fill / count) for w, (fill, count) in sorted(t.windows.items())
            )
            result.append(
                QueueStats(
                    name=name,
                    kind=t.kind,
                    capacity=t.capacity,
                    samples=int(t.samples),
                    mean_fill=t.fill / n,
                    empty_share=t.empty / n,
                    full_share=t.full / n,
                    messages=t.messages,
                    bytes_moved=t.moved,
                    bytes_via_shm=t.via_shm,
                    shm_held_mib=t.held / 2**20,
                    shm_peak_mib=t.peak / 2**20,
                    timeline=timeline,
                )
            )
        return tuple(result)


def _to_main(queues: Sequence[QueueStats]) -> list[QueueStats]:
    return [q for q in queues if q.name.endswith("-> main") and q.samples]


def queue_verdict(queues: Sequence[QueueStats]) -> str:
    """A clause for a loader-bound verdict when the queues to the main process explain it."""
    to_main = _to_main(queues)
    if not to_main:
        return ""
    empty = sum(q.empty_share * q.samples for q in to_main) / sum(q.samples for q in to_main)
    if empty < EMPTY_VERDICT:
        return ""
    return f"; the queues to the main process were empty {empty:.0%} of the time it asked"


def queue_lines(queues: Sequence[QueueStats]) -> list[str]:
    """The printed record's queue table."""
    if not queues:
        return []
    lines = [
        f"  {'queue':<34} {'fill':>5} {'empty':>6} {'full':>5} {'messages':>9} "
        f"{'MiB moved':>9} {'shm MiB now/peak':>16}"
    ]
    for q in queues:
        shm = "" if q.kind == "thread" else f"{q.shm_held_mib:.1f}/{q.shm_peak_mib:.1f}"
        # A queue that lived between two samples (autotune retired it): counts, no fill.
        fill = (
            f"{q.mean_fill:>5.0%} {q.empty_share:>6.0%} {q.full_share:>5.0%}"
            if q.samples
            else f"{'-':>5} {'-':>6} {'-':>5}"
        )
        lines.append(
            f"  {q.name:<34} {fill} {q.messages:>9} {q.bytes_moved / 2**20:>9.1f} {shm:>16}"
        )
    return lines


def _pair() -> list[float]:
    return [0.0, 0.0]
