"""Where each thread of this process is, sampled: no counter on the per-item path.

A daemon thread looks at every thread's Python stack every ``interval``
seconds (``sys._current_frames()``) and counts one sample for what it finds:
the innermost block running (``busy``), a block waiting for its upstream
(``waiting``), a worker handing an output on or blocked on a full queue
(``handoff``), the consumer inside ``next(loader)`` outside any block
(``transfer``), or the consumer outside the loader (``consumer``). Counting
samples instead of calls keeps the blocks' hot loops untouched whether
statistics are on or off; the price is resolution (a share is exact to about
``1 / samples``).

Worker processes run their own sampler (started after ``fork``, or at import
when ``PIPELOOM_STATS_DIR`` is set) and write their counts, a few times a
second, to a file in that directory, which the main process reads.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import multiprocessing.util
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from types import CodeType, FrameType
from typing import Any, TypeVar

from ..datapipes import DataPipe
from ..datapipes.runtime import RUN_LOOP_CODES, running_stage
from ..events import Waiter
from ._resources import own_usage

__all__ = [
    "ENV_DIR",
    "Sampler",
    "block_label",
    "read_reports",
    "register_boundary",
    "report_target",
    "report_to",
    "sampler",
]

ENV_DIR = "PIPELOOM_STATS_DIR"
"""Where worker processes write their counts (set by a loader collecting statistics)."""
INTERVAL = 0.005
"""Seconds between two samples."""
WINDOW = 0.5
"""Seconds per bucket of the timeline."""
KEPT_WINDOWS = 7200
"""Timeline buckets kept: the last hour. Older ones are dropped as new ones begin, so
the statistics of a run of days stay as small as an hour's (the totals cover the run)."""
_WRITE_EVERY = 0.25  # seconds between two reports of a worker process (at least)

Key = tuple[str, str, str]  # (placement, stage, kind)
V = TypeVar("V")

_PAUSE_GC = sys.version_info < (3, 12)
_GC_SWITCH = threading.Lock()


def window_of(windows: dict[int, V], index: int, make: Callable[[], V]) -> V:
    """``windows[index]``, made by ``make()`` if new; the oldest beyond :data:`KEPT_WINDOWS` go.

    Windows are added in time order, so the dict's first key is the oldest.

    Example:
        >>> windows = {}
        >>> for index in range(KEPT_WINDOWS + 2):
        ...     window_of(windows, index, list).append(index)
        >>> len(windows), next(iter(windows))
        (7200, 2)
    """
    window = windows.get(index)
    if window is None:
        window = windows[index] = make()
        while len(windows) > KEPT_WINDOWS:
            del windows[next(iter(windows))]
    return window


def thread_frames() -> dict[int, FrameType]:
    """``sys._current_frames()``, safe on CPython 3.11.

    On 3.11 it holds the runtime's thread-list lock while it makes frame
    objects; a garbage collection started by one of those allocations that
    frees a ``threading.local`` takes the same lock again and the process
    freezes holding the GIL (CPython gh-106883, never fixed in 3.11). The
    collector is paused for the call there, and left alone when the user
    disabled it.
    """
    if not _PAUSE_GC:
        return sys._current_frames()  # noqa: SLF001 - the sampler's input
    with _GC_SWITCH:
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            return sys._current_frames()  # noqa: SLF001 - the sampler's input
        finally:
            if paused:
                gc.enable()


_IDLE_CODES: set[CodeType] = {
    Waiter.wait.__code__,
    Waiter._wait_selecting.__code__,  # noqa: SLF001 - the waiting frame itself
    threading.Condition.wait.__code__,
    threading.Event.wait.__code__,
}
_BOUNDARIES: dict[CodeType, str] = {}  # code -> "loader" (consumer side) or "worker"


def register_boundary(function: Any, kind: str) -> None:
    """Mark ``function``'s frames as the loader's ``next`` or a worker's epoch loop."""
    _BOUNDARIES[function.__code__] = kind


def register_idle(function: Any) -> None:
    """Mark ``function``'s frames as a thread waiting (a queue's blocking get/put)."""
    _IDLE_CODES.add(function.__code__)


def block_label(block: DataPipe) -> str:
    """``"Mapper(decode)"``: the block's class, and its function's name when it has one.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> def double(x):
        ...     return 2 * x
        >>> block_label(IterableWrapper([1]).map(double))
        'Mapper(double)'
    """
    name = type(block).__name__
    fn = getattr(block, "fn", None) or getattr(block, "filter_fn", None)
    if callable(fn):
        inner = getattr(fn, "func", fn)  # functools.partial
        return f"{name}({getattr(inner, '__name__', type(inner).__name__)})"
    return name


class _BlockCodes:
    """The code objects of every block class's methods (refreshed as classes appear)."""

    def __init__(self) -> None:
        self.codes: set[CodeType] = set()
        self._classes: set[type] = set()
        self._checked = 0.0

    def refresh(self, now: float) -> None:
        if now - self._checked < 1.0:
            return
        self._checked = now
        pending = [DataPipe]
        while pending:
            cls = pending.pop()
            pending.extend(cls.__subclasses__())
            if cls in self._classes:
                continue
            self._classes.add(cls)
            for value in vars(cls).values():
                self.codes.update(_codes_of(value))


def _codes_of(value: Any) -> Iterable[CodeType]:
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    while value is not None:
        code = getattr(value, "__code__", None)
        if isinstance(code, CodeType):
            yield code
        value = getattr(value, "__wrapped__", None)


def _placement_of_thread(thread: threading.Thread | None) -> str:
    if thread is None or thread is threading.main_thread():
        return "main process"
    if thread.name.startswith("pipeloom-worker-"):
        return "worker threads"
    name = re.sub(r"\(.*\)$|[-_ ]?\d+$", "", thread.name).removeprefix("pipeloom")
    return name.strip(" -_") + " thread"  # e.g. "Prefetcher thread"


def _process_placement() -> str | None:
    """``"worker processes"`` in a classic worker; None before the process has its name."""
    name = multiprocessing.current_process().name
    if name == "MainProcess":
        return None
    name = re.sub(r"[-_ ]?\d+$", "", name).removeprefix("pipeloom-").replace("-", " ")
    return _PROCESS_PLACEMENTS.get(name, name if name.endswith("s") else name + "s")


_PROCESS_PLACEMENTS = {
    "worker": "worker processes",
    "worker process": "worker processes",
    "separate": "separate process",
}


class Sampler:
    """Counts, per ``(placement, stage, kind)``, what this process's threads are doing."""

    def __init__(self, interval: float = INTERVAL, report_dir: str | None = None) -> None:
        self.interval = interval
        self.report_dir = report_dir
        self.started = time.time()
        self.counts: Counter[Key] = Counter()
        self.timeline: dict[int, Counter[Key]] = {}
        self.samples = 0
        self.cpu_s = 0.0  # CPU seconds the sampling thread used
        self._lock = threading.Lock()
        self._codes = _BlockCodes()
        self._stop = threading.Event()
        self._in_worker = report_dir is not None  # a worker process: named by its process
        self._users = 0
        self._thread: threading.Thread | None = None

    # -- lifetime -----------------------------------------------------------------
    def acquire(self) -> None:
        """One more user; the first starts the sampling thread."""
        with self._lock:
            self._users += 1
            if self._thread is None:
                self._stop = threading.Event()  # its own: a stopping sampler stays stopped
                self._thread = threading.Thread(
                    target=self._run,
                    args=(self._stop,),
                    name="pipeloom-stats-sampler",
                    daemon=True,
                )
                self._thread.start()

    def release(self) -> None:
        """One user fewer; the last stops the sampling thread."""
        with self._lock:
            self._users = max(0, self._users - 1)
            thread = self._thread if self._users == 0 else None
            if thread is not None:
                self._thread = None
                self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)

    def snapshot(self) -> tuple[Counter[Key], dict[int, Counter[Key]], int]:
        """A copy of the counts, the timeline (window -> counts) and the number of samples."""
        with self._lock:
            timeline = {w: Counter(c) for w, c in self.timeline.items()}
            return Counter(self.counts), timeline, self.samples

    # -- sampling -------------------------------------------------------------------
    def _run(self, stop: threading.Event) -> None:
        me = threading.get_ident()
        written = time.monotonic()
        # A clock, not a poll: the wait ends a sampling period (or the sampler).
        spent = self.cpu_s - time.thread_time()  # this thread's CPU time adds to cpu_s
        while not stop.wait(self.interval):
            self.sample_once(skip=me)
            self.cpu_s = spent + time.thread_time()
            # Every 0.25 s, less often as the report (the timeline) grows, up to an hour's.
            every = max(_WRITE_EVERY, min(time.time() - self.started, KEPT_WINDOWS * WINDOW) / 100)
            if self.report_dir is not None and time.monotonic() - written >= every:
                written = time.monotonic()
                self.write_report()
        if self.report_dir is not None:
            self.write_report()

    def sample_once(self, skip: int | None = None) -> None:
        """Take one sample of every thread but ``skip``."""
        now = time.time()
        self._codes.refresh(now)
        threads = {t.ident: t for t in threading.enumerate()}
        found: list[Key] = []
        frames = thread_frames()
        while frames:  # each let go once read: a frame held keeps its locals (a loader) alive
            ident, frame = frames.popitem()
            if ident == skip:
                continue
            try:
                key = self._classify(frame, threads.get(ident))
            except AttributeError:  # its stack changed under the walk (see _classify)
                continue
            finally:
                del frame
            if key is not None:
                found.append(key)
        window = int((now - self.started) // WINDOW)
        with self._lock:
            self.samples += 1
            bucket = window_of(self.timeline, window, Counter)
            for key in found:
                self.counts[key] += 1
                bucket[key] += 1

    def _classify(self, frame: FrameType, thread: threading.Thread | None) -> Key | None:
        """The key of a thread's sample; raises ``AttributeError`` where its stack changed
        while it was walked (the walk runs Python, so the thread may run meanwhile, and on
        3.11 a frame it left can lead to an object that is no frame): that sample is lost."""
        codes = self._codes.codes
        idle = False  # a waiting frame inside the innermost block (or the boundary)
        block: DataPipe | None = None
        boundary = None
        current: FrameType | None = frame
        callee: FrameType | None = None
        while current is not None:
            code = current.f_code
            if block is None and code in _IDLE_CODES:
                idle = True
            if block is None and code in codes:
                candidate = current.f_locals.get("self")
                if isinstance(candidate, DataPipe):
                    block = candidate
            if block is None and callee is not None and code in RUN_LOOP_CODES:
                # a fused run calls a map's function itself: find the map
                block = running_stage(current.f_locals.get("self"), callee.f_code)
            boundary = _BOUNDARIES.get(code)
            if boundary is not None:
                break
            callee, current = current, current.f_back
        if self._in_worker:
            process = _process_placement()
            if process is None:  # just forked, not yet named
                return None
            placement = process
        else:
            placement = _placement_of_thread(thread)
        if block is not None:
            return placement, block_label(block), "waiting" if idle else "busy"
        if boundary == "worker":
            return placement, "", "handoff"
        if boundary == "loader":
            return placement, "", "idle" if idle else "transfer"
        if placement == "main process":
            return placement, "", "consumer"
        return None  # a thread that is not the pipeline's

    # -- worker processes --------------------------------------------------------------
    def write_report(self) -> None:
        """Write this process's counts to ``report_dir`` (atomically)."""
        if self.report_dir is None:
            return
        counts, timeline, samples = self.snapshot()
        cpu_s, peak_rss_mib = own_usage()
        report = {
            "pid": os.getpid(),
            "placement": _process_placement(),
            "cpu_s": cpu_s,
            "peak_rss_mib": peak_rss_mib,
            "started": self.started,
            "samples": samples,
            "counts": [[*key, n] for key, n in counts.items()],
            "timeline": [
                [window, *key, n]
                for window, bucket in timeline.items()
                for key, n in bucket.items()
            ],
        }
        path = os.path.join(self.report_dir, f"{os.getpid()}.json")
        try:
            with open(path + ".tmp", "w") as f:
                json.dump(report, f)
            os.replace(path + ".tmp", path)
        except OSError:  # the loader removed the directory: it no longer listens
            pass


def read_reports(directory: str) -> list[dict[str, Any]]:
    """The reports worker processes wrote in ``directory``."""
    reports = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                reports.append(json.load(f))
        except (OSError, ValueError):
            continue  # being replaced: the next read has it
    return reports


_SAMPLER: list[Sampler | None] = [None]


def sampler() -> Sampler:
    """This process's sampler (created on first use)."""
    current = _SAMPLER[0]
    if current is None:
        current = _SAMPLER[0] = Sampler()
    return current


def report_target(directory: str) -> str:
    """The value of ``PIPELOOM_STATS_DIR``: this process's pid and the directory."""
    return f"{os.getpid()}:{directory}"


def _report_dir() -> str | None:
    """The directory to report to, in a process started by a loader collecting statistics."""
    owner, _, directory = os.environ.get(ENV_DIR, "").partition(":")
    if not directory or owner == str(os.getpid()):
        return None  # not asked, or the loader's own process
    return directory


def _start_in_worker_process() -> None:
    """In a new process (fork child, or import under spawn) with reports asked for: sample."""
    _SAMPLER[0] = None  # the parent's, without its thread
    directory = _report_dir()
    if directory is None:
        return
    worker = Sampler(report_dir=directory)
    _SAMPLER[0] = worker
    worker.acquire()


def _at_worker_bootstrap(_: object) -> None:
    """In a ``multiprocessing`` child, as it starts: write a last report when it exits."""
    current = _SAMPLER[0]
    if current is not None and current.report_dir is not None:
        multiprocessing.util.Finalize(None, current.write_report, exitpriority=0)


def report_to(target: str | None) -> None:
    """In a new worker process: report to ``target`` (a ``PIPELOOM_STATS_DIR`` value, or None).

    For a process whose environment came from a fork server, not its loader:
    the sampler started for the inherited value (if any) stops without writing.
    """
    if os.environ.get(ENV_DIR) == target:
        return
    stale = _SAMPLER[0]
    if stale is not None and stale.report_dir is not None:
        stale.report_dir = None  # writes nothing where another loader listens
        stale.release()
    if target is None:
        os.environ.pop(ENV_DIR, None)
    else:
        os.environ[ENV_DIR] = target
    _start_in_worker_process()
    _at_worker_bootstrap(None)


class _Key:  # the after-fork registry holds its keys weakly: this one lives with the module
    pass


_KEY = _Key()
os.register_at_fork(after_in_child=_start_in_worker_process)
multiprocessing.util.register_after_fork(_KEY, _at_worker_bootstrap)
if _report_dir() is not None:
    _start_in_worker_process()
