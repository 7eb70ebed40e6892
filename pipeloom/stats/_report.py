"""``LoaderStats``: what ``loader.stats()`` returns, and the one-line verdict."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from ._queues import QueueStats, queue_lines

__all__ = ["LoaderStats", "ProcessUse", "RankStats", "StageStats", "TimelinePoint"]

LOADER_BOUND_READINESS = 0.5
"""With workers: below this share of ready ``next()`` calls the loader is the bottleneck."""
LOADER_BOUND_WAIT = 0.1
"""Above this share of the loop's time spent in ``next(loader)``, the loader is the bottleneck
(with workers too: round-robin workers make every other call ready even when all are late)."""
STRAGGLER_RATIO = 1.2
"""A rank whose loading time per output exceeds the others' median this much is a straggler."""


@dataclass(frozen=True)
class StageStats:
    """One block (or hand-off) in one placement.

    Attributes:
        placement: where it runs: ``"main process"``, ``"worker threads"``,
            ``"worker processes"``, ...
        stage: the block (``"Mapper(decode)"``); ``"(hand-off)"`` is a worker
            passing outputs on (or blocked on a full queue), ``"(transfer)"``
            the main process receiving them outside any block.
        busy_s: seconds its replicas spent in it, summed (sampled).
        waiting_s: seconds it spent waiting for its upstream (sampled).
        wait_share: its share of the consumer's wait (the shares sum to 1).
        outputs_per_s: loader outputs per second it could sustain with its
            replicas if it were alone (None when it was never seen busy).
    """

    placement: str
    stage: str
    busy_s: float
    waiting_s: float
    wait_share: float
    outputs_per_s: float | None


@dataclass(frozen=True)
class ProcessUse:
    """What the processes of one placement used (worker processes report theirs).

    Attributes:
        placement: ``"main process"``, ``"worker processes"``, ...
        processes: how many processes reported.
        cpu_s: CPU seconds they used (the main process: since statistics started;
            a worker: since it started).
        peak_rss_mib: the largest peak resident memory among them.
    """

    placement: str
    processes: int
    cpu_s: float
    peak_rss_mib: float


@dataclass(frozen=True)
class RankStats:
    """One rank of a distributed job (``straggler``: the slowest to load, by a margin)."""

    rank: int
    outputs: int
    outputs_per_s: float
    wait_per_output_s: float
    readiness: float | None
    straggler: bool


@dataclass(frozen=True)
class TimelinePoint:
    """One window of the run: sink throughput, readiness and each stage's busy share."""

    start_s: float
    outputs_per_s: float
    readiness: float | None
    busy: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LoaderStats:
    """What the loader did since statistics started; ``print()`` it.

    Attributes:
        service: the strategy (``"in-process"``, ``"threads"``, ``"classic"``, ...).
        workers: how many worker replicas run the workers' part (0 in-process).
        outputs: items the loader delivered.
        elapsed_s: seconds from the first ``next()`` to the last output.
        outputs_per_s: ``outputs / elapsed_s``.
        first_output_s: seconds the first ``next()`` took (start-up included).
        wait_s: seconds the consumer spent inside ``next(loader)``.
        step_s: seconds the consumer spent between two ``next()`` (its own work).
        readiness: share of ``next()`` calls that found an output ready
            (None in-process, where every output is made on demand).
        stages: per block and placement, largest share of the wait first.
        ranks: per rank, when distributed.
        samples: sampling periods the figures come from.
        verdict: one line: ``"loader-bound: ..."`` or ``"consumer-bound: ..."``.
        timeline: per half second: throughput, readiness, each stage's busy share
            (the last hour of a longer run).
        headspace_step_s: the mean step time over replayed cached outputs,
            when a :class:`pipeloom.stats.Headspace` measured it.
        processes: CPU time and peak memory per placement.
        shared_memory_mib: shared memory this process tree holds now.
        sampler_cpu_s: CPU seconds the main process's sampling thread used
            (what statistics cost, besides timing each ``next()``).
        autotune: under ``reading_service="auto"``: what runs now
            (``"config"``, ``"chosen"``), how many times the epoch was re-placed,
            the budget, and each measured trial (``pipeloom.autotune``); else None.
        queues: each queue of the plan (workers to the main process, tasks to
            workers, a separate process's), sampled when the consumer asked:
            occupancy, bytes moved, shared memory held (``QueueStats``).
    """

    service: str
    workers: int
    outputs: int
    elapsed_s: float
    outputs_per_s: float
    first_output_s: float | None
    wait_s: float
    step_s: float
    readiness: float | None
    stages: tuple[StageStats, ...]
    ranks: tuple[RankStats, ...]
    samples: int
    verdict: str
    timeline: tuple[TimelinePoint, ...] = ()
    headspace_step_s: float | None = None
    processes: tuple[ProcessUse, ...] = ()
    shared_memory_mib: float = 0.0
    sampler_cpu_s: float = 0.0
    autotune: dict[str, Any] | None = None
    queues: tuple[QueueStats, ...] = ()

    @property
    def loader_bound(self) -> bool:
        """True when the verdict is "loader-bound"."""
        return self.verdict.startswith("loader-bound")

    def stage(self, name: str) -> StageStats:
        """The first stage whose name contains ``name`` (largest wait share first)."""
        for stage in self.stages:
            if name in stage.stage:
                return stage
        raise KeyError(f"no stage named like {name!r}; stages: {[s.stage for s in self.stages]}")

    def to_dict(self) -> dict[str, Any]:
        """A plain, JSON-serialisable dict of every figure."""
        return asdict(self)

    def __str__(self) -> str:
        ready = "n/a (in-process)" if self.readiness is None else f"{self.readiness:.0%}"
        first = "n/a" if self.first_output_s is None else f"{self.first_output_s:.3f} s"
        lines = [
            f"pipeloom loader statistics: {self.service}, {self.workers} worker(s)",
            f"  outputs {self.outputs} in {self.elapsed_s:.2f} s: {self.outputs_per_s:.1f}/s; "
            f"first output after {first}",
            f"  consumer waited {self.wait_s:.2f} s, stepped {self.step_s:.2f} s; "
            f"readiness {ready}; {self.samples} samples ({self.sampler_cpu_s:.2f} CPU s)",
            f"  {'stage':<32} {'placement':<20} {'wait share':>10} {'busy s':>8} "
            f"{'waiting s':>9} {'capacity/s':>10}",
        ]
        for s in self.stages:
            capacity = "" if s.outputs_per_s is None else f"{s.outputs_per_s:.1f}"
            lines.append(
                f"  {s.stage:<32} {s.placement:<20} {s.wait_share:>10.0%} {s.busy_s:>8.2f} "
                f"{s.waiting_s:>9.2f} {capacity:>10}"
            )
        for r in self.ranks:
            flag = "  <- straggler" if r.straggler else ""
            lines.append(
                f"  rank {r.rank}: {r.outputs_per_s:.1f} outputs/s, "
                f"{r.wait_per_output_s * 1000:.1f} ms loading per output{flag}"
            )
        for p in self.processes:
            lines.append(
                f"  {p.placement} ({p.processes}): {p.cpu_s:.2f} CPU s, "
                f"peak RSS {p.peak_rss_mib:.0f} MiB"
            )
        lines.extend(queue_lines(self.queues))
        lines.append(f"  shared memory in use: {self.shared_memory_mib:.1f} MiB")
        if self.headspace_step_s is not None:
            loop = (self.wait_s + self.step_s) / self.outputs if self.outputs else 0.0
            lines.append(
                f"  headspace: best-case step {self.headspace_step_s * 1000:.1f} ms "
                f"(replayed cached outputs), against {loop * 1000:.1f} ms per output with loading"
            )
        if self.autotune is not None:
            lines.extend(_autotune_lines(self.autotune))
        lines.append(f"  verdict: {self.verdict}")
        return "\n".join(lines)


def _autotune_lines(report: dict[str, Any]) -> list[str]:
    state = "settled" if report.get("settled") else "still measuring"
    lines = [
        f"  autotune: {report.get('chosen')} ({state}; re-placed "
        f"{report.get('replacements', 0)} time(s) mid-run)"
    ]
    for trial in report.get("trials", ()):
        config = trial["config"]
        how = config.get("strategy", "classic")
        how = "" if how == "classic" else f" ({how})"
        lines.append(
            f"    at {trial['at_s']:6.2f} s: {config['workers']} {config['kind']}{how}, prefetch "
            f"{config['prefetch']}: {trial['outputs_per_s']:.1f} outputs/s, "
            f"{trial['cores']:.1f} cores -> {trial['verdict']}"
        )
    return lines


def verdict(
    *,
    service: str,
    workers: int,
    readiness: float | None,
    wait_s: float,
    step_s: float,
    outputs: int,
    stages: tuple[StageStats, ...],
    ranks: tuple[RankStats, ...],
) -> str:
    """The one-line judgement (see the thresholds above)."""
    straggler = next((r for r in ranks if r.straggler), None)
    suffix = (
        f"; rank {straggler.rank} is the straggler "
        f"({straggler.wait_per_output_s * 1000:.1f} ms loading per output)"
        if straggler is not None
        else ""
    )
    loop = wait_s + step_s
    if readiness is None:
        waiting = wait_s / loop if loop > 0 else 0.0
        if waiting <= LOADER_BOUND_WAIT:
            return f"consumer-bound: loading takes {waiting:.0%} of the loop's time{suffix}"
        top = _top(stages)
        return (
            f"loader-bound: loading runs in the training loop and takes {waiting:.0%} of its "
            f"time; {top} takes {_share(stages):.0%} of it; ThreadReadingService(n) or "
            f"MultiProcessingReadingService(n) would overlap it with the step{suffix}"
        )
    waiting = wait_s / loop if loop > 0 else 0.0
    if readiness >= LOADER_BOUND_READINESS and waiting <= LOADER_BOUND_WAIT:
        return f"consumer-bound: the loader is ready {readiness:.0%} of the time{suffix}"
    return (
        f"loader-bound: {_top(stages)} takes {_share(stages):.0%} of the wait; "
        f"{_advice(service, workers, stages, wait_s, step_s, outputs)}{suffix}"
    )


def _top(stages: tuple[StageStats, ...]) -> str:
    if not stages:
        return "nothing sampled"
    s = stages[0]
    return f"{s.stage} in the {s.placement}" if s.stage else f"the {s.placement}"


def _share(stages: tuple[StageStats, ...]) -> float:
    return stages[0].wait_share if stages else 0.0


def _advice(
    service: str,
    workers: int,
    stages: tuple[StageStats, ...],
    wait_s: float,
    step_s: float,
    outputs: int,
) -> str:
    top = stages[0] if stages else None
    if top is None:
        return "too few samples to say which stage"
    if top.placement.startswith("worker") or top.placement.endswith("workers"):
        cores = os.cpu_count() or 1
        elapsed = wait_s + step_s
        achieved = outputs / elapsed if elapsed > 0 else 0.0
        if top.outputs_per_s is not None and achieved and top.outputs_per_s > 1.5 * achieved:
            return (
                f"its workers ran only part of the time (it could give "
                f"{top.outputs_per_s:.0f} outputs/s, the loader gave {achieved:.0f}): the "
                f"{cores} cores are busy with other work; fewer competing processes or a cheaper "
                f"{top.stage} would help, more workers would not"
            )
        if step_s < 0.05 * wait_s or outputs == 0:  # a consumer that does (almost) nothing
            workers_tip = f"more workers (this machine has {cores} cores)"
        else:  # workers deliver n / T_p per second; the consumer takes 1 / T_c
            needed = math.ceil(max(workers, 1) * (step_s + wait_s) / step_s)
            more = max(1, needed - workers)
            workers_tip = f"{more} more worker{'s' if more > 1 else ''}"
            if needed > cores:
                workers_tip += f" (more than this machine's {cores} cores)"
        if service == "classic" and top.placement == "worker processes":
            return f"{workers_tip} or strategy='chunked' would help"
        return f"{workers_tip} would help"
    if top.stage == "(transfer)":
        return (
            "receiving outputs from the workers dominates: larger batches, fewer copies "
            "(tensors), or threads for GIL-free work would help"
        )
    return (
        f"it runs in the {top.placement}, after the workers' merge; placing it before "
        f"the batching (per item) lets the workers run it"
    )
