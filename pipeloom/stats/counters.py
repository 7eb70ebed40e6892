"""What a loader collecting statistics keeps (the loader's seam into ``pipeloom.stats``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from ..events import blocked_waits
from ..graph import Placement, Plan
from ..reading_service import DistributedReadingService, ReadingService
from ..reading_service.workers.epoch import produce_epoch
from ._headspace import headspace_of
from ._queues import QueueWatch, queue_verdict
from ._report import (
    STRAGGLER_RATIO,
    LoaderStats,
    ProcessUse,
    RankStats,
    StageStats,
    TimelinePoint,
    verdict,
)
from ._resources import own_usage, shared_memory_in_use
from ._sampler import (
    ENV_DIR,
    WINDOW,
    Key,
    Sampler,
    read_reports,
    register_boundary,
    report_target,
    sampler,
    window_of,
)

__all__ = ["LoaderCounters", "assemble"]

register_boundary(produce_epoch, "worker")

_HANDOFF, _TRANSFER = "(hand-off)", "(transfer)"


class LoaderCounters:
    """One loader's statistics: per ``next()`` (wait, readiness) and the process samplers'.

    ``next()`` is timed per delivered output (a batch, usually), never per item
    inside the pipeline; the stages' time comes from sampling (``_sampler.py``).
    """

    def __init__(self) -> None:
        self.outputs = 0
        self.ready = 0
        self.wait_s = 0.0
        self.step_s = 0.0
        self.first_call: float | None = None
        self.first_output_s: float | None = None
        self.last_output: float | None = None
        self.windows: dict[int, list[float]] = {}  # window -> [outputs, ready]
        self.headspace_step_s: float | None = None
        self.sampler = sampler()
        self._baseline: Counter[Key] = Counter()
        self._samples0 = 0
        self._started = time.time()
        self._perf_started = time.perf_counter()  # the same moment, on the clock next() uses
        self._dir: str | None = None
        self._final: tuple[Counter[Key], dict[int, Counter[Key]], int] | None = None
        self._cpu0 = 0.0
        self._sampler_cpu0 = 0.0
        self._processes: list[ProcessUse] = []
        self.queue_watch: QueueWatch | None = None
        self.in_replay = False

    # -- lifetime -----------------------------------------------------------------------
    def start(self) -> None:
        """Make the folder worker processes report to; the figures count from now."""
        self._dir = tempfile.mkdtemp(prefix="pipeloom-stats-")
        self._baseline, _, self._samples0 = self.sampler.snapshot()
        self._cpu0 = own_usage()[0]
        self._sampler_cpu0 = self.sampler.cpu_s

    @contextlib.contextmanager
    def exporting(self) -> Iterator[None]:
        """Worker processes started inside this block report to this loader.

        (Through an environment variable, set only meanwhile: workers of other
        loaders, started at other times, do not report here.)
        """
        if self._dir is None:
            yield
            return
        previous = os.environ.get(ENV_DIR)
        os.environ[ENV_DIR] = report_target(self._dir)
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(ENV_DIR, None)
            else:
                os.environ[ENV_DIR] = previous

    def stop(self) -> None:
        """Keep the figures as they are now (call after the workers stopped; idempotent)."""
        if self._dir is None:
            return
        self._final = self._samples()
        shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None

    @contextlib.contextmanager
    def replaying(self) -> Iterator[None]:
        """Outputs read meanwhile are a resume's replay, dropped: not counted as outputs.

        (They were: a state of another strategy resumed after 6 of 10 batches showed
        10 outputs, and their waits, for the 4 the loop received.)
        """
        self.in_replay = True
        try:
            yield
        finally:
            self.in_replay = False

    def watch(self, items: Iterator[Any], service: ReadingService) -> Iterator[Any]:
        """``items``, each ``next()`` timed; this process and ``service``'s queues are
        sampled until they end."""
        if self.queue_watch is None:
            self.queue_watch = QueueWatch(service.queues, started=self._perf_started)
        self.queue_watch.count()  # the last epoch's queues a last time (if it was dropped)
        self.queue_watch.release()
        self.queue_watch.count()  # this epoch's, read again when it ends
        return _Watched(items, self)

    def count_queues(self) -> None:
        """Read what crossed the queues now (autotune: before it stops workers, after starting)."""
        if self.queue_watch is not None:
            self.queue_watch.count()

    # -- per output -------------------------------------------------------------------------
    def record(self, called: float, returned: float, ready: bool, previous: float | None) -> None:
        """One output: ``next()`` ran from ``called`` to ``returned`` (``perf_counter``).

        Called by the consumer's thread only; no lock (a ``stats()`` from another
        thread may see one output half counted).
        """
        if self.first_call is None:
            self.first_call = called
            self.first_output_s = returned - called
        elif previous is not None:
            self.step_s += called - previous
        self.outputs += 1
        self.wait_s += returned - called
        self.ready += ready
        self.last_output = returned
        window = window_of(self.windows, int((returned - self._perf_started) // WINDOW), _pair)
        window[0] += 1
        window[1] += ready

    # -- the record --------------------------------------------------------------------------
    def _samples(self) -> tuple[Counter[Key], dict[int, Counter[Key]], int]:
        if self._final is not None:
            return self._final
        counts, timeline, samples = self.sampler.snapshot()
        counts.subtract(self._baseline)
        start = self.sampler.started
        shift = int((self._started - start) // WINDOW)
        timeline = {w - shift: c for w, c in timeline.items() if w >= shift}
        cpu_s, peak = own_usage()
        uses: dict[str, list[float]] = {"main process": [1, cpu_s - self._cpu0, peak]}
        for report in read_reports(self._dir) if self._dir else []:
            if report["placement"] is not None:
                use = uses.setdefault(report["placement"], [0, 0.0, 0.0])
                use[0] += 1
                use[1] += report["cpu_s"]
                use[2] = max(use[2], report["peak_rss_mib"])
            for placement, stage, kind, n in report["counts"]:
                counts[(placement, stage, kind)] += n
            offset = int((report["started"] - self._started) // WINDOW)
            for window, placement, stage, kind, n in report["timeline"]:
                timeline.setdefault(window + offset, Counter())[(placement, stage, kind)] += n
        self._processes = [ProcessUse(name, int(n), c, p) for name, (n, c, p) in uses.items()]
        return +counts, timeline, samples - self._samples0

    def build(
        self,
        *,
        service: str,
        workers: int,
        ranks: tuple[RankStats, ...] = (),
        autotune: dict[str, Any] | None = None,
    ) -> LoaderStats:
        """The frozen record of what happened so far."""
        counts, timeline, samples = self._samples()
        interval = self.sampler.interval
        elapsed = (
            0.0
            if self.first_call is None or self.last_output is None
            else self.last_output - self.first_call
        )
        replicas = {use.placement: use.processes for use in self._processes}
        replicas["worker threads"] = max(workers, 1)
        stages = _stages(counts, interval, self.outputs, replicas)
        readiness = None
        if service != "in-process" and self.outputs:
            readiness = self.ready / self.outputs
        queues = () if self.queue_watch is None else self.queue_watch.summary()
        judged = verdict(
            service=service,
            workers=workers,
            readiness=readiness,
            wait_s=self.wait_s,
            step_s=self.step_s,
            outputs=self.outputs,
            stages=stages,
            ranks=ranks,
        )
        if judged.startswith("loader-bound"):
            judged += queue_verdict(queues)
        return LoaderStats(
            service=service,
            workers=workers,
            outputs=self.outputs,
            elapsed_s=elapsed,
            outputs_per_s=self.outputs / elapsed if elapsed > 0 else 0.0,
            first_output_s=self.first_output_s,
            wait_s=self.wait_s,
            step_s=self.step_s,
            readiness=readiness,
            stages=stages,
            ranks=ranks,
            samples=samples,
            verdict=judged,
            timeline=_timeline(timeline, self.windows, service),
            headspace_step_s=self.headspace_step_s,
            processes=tuple(self._processes),
            shared_memory_mib=shared_memory_in_use() / 2**20,
            sampler_cpu_s=self.sampler.cpu_s - self._sampler_cpu0,
            autotune=autotune,
            queues=queues,
        )


class _Watched(Iterator[Any]):
    """An epoch's items with each ``next()`` timed (one per output, not per item).

    The process's sampler runs from the epoch's start until its end or close.
    """

    def __init__(self, items: Iterator[Any], counters: LoaderCounters) -> None:
        self._items = items
        self._counters = counters
        self._returned: float | None = None
        self._sampler: Sampler | None = counters.sampler
        counters.sampler.acquire()

    def __next__(self) -> Any:
        blocked = blocked_waits()
        called = time.perf_counter()
        watch = self._counters.queue_watch
        if watch is not None:  # what the queues hold when the consumer asks
            watch.maybe_sample(called)
        try:
            item = next(self._items)
        except BaseException:
            self._count_queues()  # the epoch ended: its last messages too
            self._release()
            raise
        if self._counters.in_replay:  # the loader's replay of a resume, dropped
            return item
        returned = time.perf_counter()
        self._counters.record(called, returned, blocked_waits() == blocked, self._returned)
        self._returned = returned
        return item

    def close(self) -> None:
        self._count_queues()
        self._release()
        close = getattr(self._items, "close", None)
        if close is not None:
            close()

    def _count_queues(self) -> None:
        watch = self._counters.queue_watch
        if self._sampler is not None and watch is not None:  # once, at the epoch's end
            watch.count()
            watch.release()

    def _release(self) -> None:
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.release()

    def __del__(self) -> None:
        self._release()


register_boundary(_Watched.__next__, "loader")


def _stages(
    counts: Counter[Key], interval: float, outputs: int, replicas: dict[str, int]
) -> tuple[StageStats, ...]:
    """Per (placement, stage): busy and waiting time, and the share of the consumer's wait.

    The main thread's samples inside ``next(loader)`` are the wait: a block busy
    there takes its samples; the main thread waiting (for workers) is shared
    among the worker stages by their busy samples (Grain's wait attribution).
    """
    busy: Counter[tuple[str, str]] = Counter()
    waiting: Counter[tuple[str, str]] = Counter()
    main_waiting = 0
    for (placement, stage, kind), n in counts.items():
        if kind == "busy":
            busy[(placement, stage)] += n
        elif kind == "handoff":
            busy[(placement, _HANDOFF)] += n
        elif kind == "transfer":
            busy[(placement, _TRANSFER)] += n
        elif kind in ("waiting", "idle"):
            if placement == "main process":
                main_waiting += n
            if stage:
                waiting[(placement, stage)] += n
    main = {key: n for key, n in busy.items() if key[0] == "main process"}
    others = {key: n for key, n in busy.items() if key[0] != "main process" and key[1] != _HANDOFF}
    total_wait = sum(main.values()) + main_waiting
    others_total = sum(others.values())
    share: dict[tuple[str, str], float] = {}
    if total_wait and (others_total or not main_waiting):
        for key, n in main.items():
            share[key] = n / total_wait
        for key, n in others.items():
            share[key] = main_waiting / total_wait * n / others_total
    elif others_total:  # the consumer never waited in a sample: the stages' weight alone
        for key, n in others.items():
            share[key] = n / others_total
    elif total_wait:
        share[("main process", "(waiting, no worker reported)")] = 1.0
    keys = set(busy) | set(waiting) | set(share)
    stages = [
        StageStats(
            placement=placement,
            stage=stage,
            busy_s=busy[(placement, stage)] * interval,
            waiting_s=waiting[(placement, stage)] * interval,
            wait_share=share.get((placement, stage), 0.0),
            outputs_per_s=(
                outputs * replicas.get(placement, 1) / (busy[(placement, stage)] * interval)
                if busy[(placement, stage)] and outputs
                else None
            ),
        )
        for placement, stage in keys
    ]
    stages.sort(key=lambda s: (-s.wait_share, -s.busy_s, s.placement, s.stage))
    return tuple(stages)


def _timeline(
    timeline: dict[int, Counter[Key]], windows: dict[int, list[float]], service: str
) -> tuple[TimelinePoint, ...]:
    points = []
    for window in sorted(set(windows) | {w for w in timeline if w >= 0}):
        outputs, ready = windows.get(window, [0, 0])
        bucket = timeline.get(window, Counter())
        busy_total = sum(n for (_, _, kind), n in bucket.items() if kind == "busy") or 1
        busy: dict[str, float] = {}
        for (placement, stage, kind), n in bucket.items():
            if kind == "busy":
                name = f"{stage} ({placement})"
                busy[name] = busy.get(name, 0.0) + n / busy_total
        points.append(
            TimelinePoint(
                start_s=window * WINDOW,
                outputs_per_s=outputs / WINDOW,
                readiness=None if service == "in-process" or not outputs else ready / outputs,
                busy=busy,
            )
        )
    return tuple(points)


def rank_stats(rows: list[tuple[int, int, float, float, float | None]]) -> tuple[RankStats, ...]:
    """Per-rank figures from ``(rank, outputs, elapsed, wait, readiness)``; flags stragglers."""
    per_output = [wait / outputs if outputs else 0.0 for _, outputs, _, wait, _ in rows]
    result = []
    for (rank, outputs, elapsed, _, readiness), mine in zip(rows, per_output, strict=True):
        others = sorted(p for p, (r, *_rest) in zip(per_output, rows, strict=True) if r != rank)
        median = others[len(others) // 2] if others else mine
        straggler = len(rows) > 1 and mine > STRAGGLER_RATIO * median and mine - median > 1e-3
        result.append(
            RankStats(
                rank=rank,
                outputs=outputs,
                outputs_per_s=outputs / elapsed if elapsed > 0 else 0.0,
                wait_per_output_s=mine,
                readiness=readiness,
                straggler=straggler,
            )
        )
    return tuple(result)


def assemble(
    counters: LoaderCounters, service: ReadingService, placement: Placement, loader: Any
) -> LoaderStats:
    """``loader.stats()``: the record, with every rank's figures when distributed.

    Distributed, this is a collective: every rank must call it.
    """
    strategy, workers = "custom", 0
    if isinstance(placement, Plan):
        strategy = placement.strategy
        workers = max((p.copies for p in placement.parts if p.role != "main"), default=0)
    ranks: tuple[RankStats, ...] = ()
    autotune = None
    for candidate in (service, *getattr(service, "services", ())):  # an AutoReadingService
        report = getattr(candidate, "autotune_report", None)
        autotune = report() if callable(report) else autotune
    service = _distributed_in(service) or service
    if isinstance(service, DistributedReadingService) and service.world_size > 1:
        import torch.distributed as dist

        mine = counters.build(service=strategy, workers=workers)
        row = (service.rank, mine.outputs, mine.elapsed_s, mine.wait_s, mine.readiness)
        rows: list[Any] = [None] * service.world_size
        dist.all_gather_object(rows, row, group=service.group)
        ranks = rank_stats(rows)
    counters.headspace_step_s = headspace_of(loader)
    return counters.build(service=strategy, workers=workers, ranks=ranks, autotune=autotune)


def _distributed_in(service: ReadingService) -> DistributedReadingService | None:
    """The ``DistributedReadingService`` of ``service`` (itself, or one it chains)."""
    if isinstance(service, DistributedReadingService):
        return service
    for inner in getattr(service, "services", ()):  # SequentialReadingService
        if isinstance(inner, DistributedReadingService):
            return inner
    return None


def _pair() -> list[float]:
    return [0, 0]
