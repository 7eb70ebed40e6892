"""How the autotuner decides: a hill climb over measured windows of delivered outputs.

The service calls :meth:`Tuner.observe` once per output the consumer receives
(the event that drives every decision: nothing polls or sleeps). The climb
measures each configuration over a window of outputs, keeps the best one, and
tries its neighbours -- twice the workers, the other kind of worker, twice the
prefetch; from classic processes, the chunked and economic strategies; from
chunked, twice and half the chunk size (those apply from the next epoch) --
within the :class:`~pipeloom.autotune.Budget`, until none is better. A
consumer slower than the loader stops the climb where it is: more loading
throughput could not help it. Once settled it keeps measuring the
configuration it chose (counters per output, nothing more); when the loader
is the bottleneck and the rate stays below :data:`RETUNE_DROP` of the settled
rate for :data:`RETUNE_WINDOWS` windows (other work took the cores, the data
got heavier), it climbs again from there.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._config import Budget, Config
from ._usage import resident_bytes, workers_cpu_seconds

__all__ = ["HillClimb", "Trial", "Tuner"]

GAIN = 1.10
"""A neighbour replaces the best configuration when it is this much faster..."""
THREADS_TIE = 0.95
"""...or, moving from processes to threads (no copies, no shared memory), when it is this close."""
CONSUMER_BOUND_WAIT = 0.10
"""Below this share of the window spent waiting in ``next()``, the consumer is the bottleneck."""
MAX_PREFETCH = 8
GIL_FREE_CORES = 0.5
"""Worker threads using fewer cores than this together are not held back by the GIL."""
CPU_SLACK = 1.05
"""Measured CPU is noisy: workers may be projected to use this share of ``cpus``."""
LINEAR = 1.7
"""A doubling of workers that multiplied the rate by this much makes the next move x4."""
ENOUGH_OUTPUTS = 500
"""A window of this many outputs closes after a third of ``window_s`` (fast pipelines)."""
RETUNE_DROP = 0.7
"""Settled, a loader-bound window below this share of the settled rate counts as a drop..."""
RETUNE_WINDOWS = 2
"""...and this many drops in a row start the climb again from the running configuration."""


@dataclass(frozen=True)
class Trial:
    """One measured window: a configuration and what it gave.

    Attributes:
        config: what ran.
        at_s: seconds since tuning started, when the window closed.
        outputs_per_s: outputs the consumer received per second in the window.
        cores: CPU cores the workers used meanwhile (the process tree, less the consumer).
        wait_share: share of the window the consumer spent waiting in ``next()``.
        verdict: ``"best"``, ``"slower"``, ``"consumer-bound"``, or
            ``"failed to start: ..."`` (that kind of worker is not tried again).
    """

    config: Config
    at_s: float
    outputs_per_s: float
    cores: float
    wait_share: float
    verdict: str


class Tuner(abc.ABC):
    """Decides, one delivered output at a time, which configuration should run next."""

    settled = False

    @abc.abstractmethod
    def start(self, config: Config) -> None:
        """``config`` runs from now on (a new epoch, or a re-placement)."""

    @abc.abstractmethod
    def observe(self, now: float, wait_s: float, output_bytes: int) -> Config | None:
        """One output delivered at ``now`` after ``wait_s`` in ``next()``; a new config or None."""

    def resume(self, config: Config) -> None:  # noqa: B027 - optional
        """A resumed job starts at ``config``, tuned already."""
        self.settled = True

    def rejected(self, config: Config, reason: str) -> None:  # noqa: B027 - optional
        """``config`` could not start (``reason``); the previous configuration runs on."""

    def deferred(self, config: Config) -> None:  # noqa: B027 - optional
        """``config`` (another strategy or chunk size) will start with the next epoch."""

    def report(self) -> dict[str, Any]:
        """What it measured and decided, for ``stats()``."""
        return {"settled": self.settled, "trials": []}


class HillClimb(Tuner):
    """The default tuner (see the module's docstring).

    Args:
        budget: the limits no configuration it proposes may exceed.
        window_s: seconds of outputs per measurement (at least ``min_outputs``).
        min_outputs: outputs per measurement, at least.
        warmup: outputs ignored after a configuration starts (its start-up).
        clock, cpu: time, and the CPU seconds the workers used (by default this
            process tree's, less the consumer's thread: the training loop is
            not the loader's to budget); injectable for tests.

    Example:
        >>> climb = HillClimb(Budget(2, 2**30, 2**30, 8, 2), window_s=0.0, min_outputs=1, warmup=0)
        >>> climb.start(Config("threads", 1, 1))
        >>> climb.observe(0.0, 0.1, 0) is None  # opens the window
        True
        >>> str(climb.observe(0.1, 0.1, 0))  # measured; next: twice the workers
        '2 worker threads, prefetch 1'
    """

    def __init__(
        self,
        budget: Budget,
        *,
        window_s: float = 0.6,
        min_outputs: int = 4,
        warmup: int = 2,
        clock: Callable[[], float] = time.perf_counter,
        cpu: Callable[[], float] = workers_cpu_seconds,
    ) -> None:
        self.budget = budget
        self.window_s = window_s
        self.min_outputs = min_outputs
        self.warmup = warmup
        self._clock = clock
        self._cpu = cpu
        self._origin = clock()
        self.trials: list[Trial] = []
        self.best: tuple[Config, float, float] | None = None  # config, outputs/s, cores/worker
        self._tried: set[Config] = set()
        self._current: Config | None = None
        self._largest_output = 0
        self._resident = 0
        self._growth = 2  # the factor the next workers move multiplies by
        self._failed_kinds: set[str] = set()  # Config.family values
        self._drops = 0
        self._waiting: Config | None = None  # deferred to the next epoch: nothing to measure
        self._reset_window()

    def _reset_window(self) -> None:
        self._seen = 0
        self._opened: float | None = None
        self._cpu0 = 0.0
        self._outputs = 0
        self._waited = 0.0

    def start(self, config: Config) -> None:
        self._waiting = None
        if config == self._current:  # a new epoch on the same configuration: keep measuring
            return
        self._current = config
        self._tried.add(config)
        if config.strategy == "chunked":  # the default chunk size, resolved by the service
            self._tried.add(dataclasses.replace(config, chunk_size=None))
        self._reset_window()

    def deferred(self, config: Config) -> None:
        self._waiting = config

    def resume(self, config: Config) -> None:
        super().resume(config)
        self.start(config)

    def observe(self, now: float, wait_s: float, output_bytes: int) -> Config | None:
        self._largest_output = max(self._largest_output, output_bytes)
        if self._current is None or self._waiting is not None:
            return None
        self._seen += 1
        if self._seen <= self.warmup:
            return None
        if self._opened is None:  # the window opens at this output's delivery
            self._opened, self._cpu0 = now, self._cpu()
            return None
        self._outputs += 1
        self._waited += wait_s
        elapsed = now - self._opened
        enough = self._outputs >= ENOUGH_OUTPUTS and elapsed >= self.window_s / 3
        if not enough and (elapsed < self.window_s or self._outputs < self.min_outputs):
            return None
        if self.settled:
            return self._watch(elapsed)
        return self._decide(elapsed)

    def _watch(self, elapsed: float) -> Config | None:
        """Settled: climb again after :data:`RETUNE_WINDOWS` loader-bound drops in a row."""
        current = self._current
        assert current is not None
        rate = self._outputs / elapsed if elapsed > 0 else math.inf
        cores = max(self._cpu() - self._cpu0, 0.0) / elapsed if elapsed > 0 else 0.0
        wait_share = self._waited / elapsed if elapsed > 0 else 1.0
        self._reset_window()
        if self.best is None or self.best[0] != current:  # resumed tuned: this is the baseline
            self.best = (current, rate, cores / current.workers)
            return None
        dropped = wait_share >= CONSUMER_BOUND_WAIT and rate < RETUNE_DROP * self.best[1]
        self._drops = self._drops + 1 if dropped else 0
        if self._drops < RETUNE_WINDOWS:
            return None
        at = self._clock() - self._origin
        self._record(current, at, rate, cores, wait_share, "dropped: tuning again")
        self.settled, self._drops, self._growth = False, 0, 2
        self.best = (current, rate, cores / current.workers)
        self._tried = {current}  # failed kinds stay out (within_budget)
        following = self._next_candidate()
        if following is None:
            self.settled = True
        return following

    def _decide(self, elapsed: float) -> Config | None:
        current = self._current
        assert current is not None
        rate = self._outputs / elapsed if elapsed > 0 else math.inf
        cores = max(self._cpu() - self._cpu0, 0.0) / elapsed if elapsed > 0 else 0.0
        wait_share = self._waited / elapsed if elapsed > 0 else 1.0
        self._resident = max(self._resident, resident_bytes())
        at = self._clock() - self._origin
        if wait_share < CONSUMER_BOUND_WAIT:  # more loading would not help the consumer
            self.best = (current, rate, cores / current.workers)
            self._record(current, at, rate, cores, wait_share, "consumer-bound")
            self._reset_window()
            return None
        verdict = "slower"
        if self.best is not None and self.best[0] == current:  # the best, measured again
            self.best, verdict = (current, max(rate, self.best[1]), cores / current.workers), "best"
        elif self.best is None or self._better(current, rate, self.best):
            if self.best is not None and self.best[0].kind == current.kind:
                # Doubling the workers nearly doubled the rate: jump further next time.
                scaled = rate / self.best[1] if self.best[1] > 0 else 1.0
                steps = max(math.log2(current.workers / self.best[0].workers), 1.0)
                self._growth = 4 if scaled ** (1 / steps) >= LINEAR else 2
            self.best, verdict = (current, rate, cores / current.workers), "best"
        self._record(current, at, rate, cores, wait_share, verdict)
        self._reset_window()
        following = self._next_candidate()
        best = self.best[0]
        if following is None:
            self.settled = True
            return best if best != current else None
        if current != best and not following.moves_within_epoch(current):
            return best  # back to the best now; the other strategy waits for an epoch anyway
        return following

    @staticmethod
    def _better(config: Config, rate: float, best: tuple[Config, float, float]) -> bool:
        if config.kind == "threads" and best[0].kind == "processes":
            return rate >= THREADS_TIE * best[1]
        return rate > GAIN * best[1]

    def _record(
        self, config: Config, at: float, rate: float, cores: float, wait: float, verdict: str
    ) -> None:
        self.trials.append(Trial(config, round(at, 3), rate, cores, wait, verdict))

    def _next_candidate(self) -> Config | None:
        """The first untried neighbour of the best configuration within the budget."""
        assert self.best is not None
        best, _, per_worker = self.best
        other = "processes" if best.kind == "threads" else "threads"
        # To processes: as many as the cores allow at the CPU a thread used (a GIL-bound best
        # may have stopped at 1 thread, or at 2 that each compute half the time).
        other_workers = (
            best.workers
            if other == "threads"
            else max(best.workers, self.budget.cpus, self._cap(other, per_worker))
        )
        more = min(self._growth * best.workers, self._cap(best.kind, per_worker))
        candidates = [
            dataclasses.replace(best, workers=more),
            Config(other, min(other_workers, self._cap(other, per_worker)), best.prefetch),
            dataclasses.replace(best, prefetch=min(2 * best.prefetch, MAX_PREFETCH)),
        ]
        if best.kind == "threads" and per_worker * best.workers < GIL_FREE_CORES:
            del candidates[1]  # threads that mostly wait hold no GIL that processes would free
        candidates += _strategy_moves(best)
        for candidate in candidates:
            if candidate not in self._tried and self.within_budget(candidate, per_worker):
                return candidate
        return None

    def _cap(self, kind: str, per_worker: float) -> int:
        most = self.budget.max_threads if kind == "threads" else self.budget.max_processes
        cpu_cap = self._cpu_cap(per_worker)
        return most if cpu_cap is None else min(most, max(1, cpu_cap))

    def _cpu_cap(self, per_worker: float) -> int | None:
        """The most workers the CPU budget allows at ``per_worker`` cores each (None: any).

        The one place that rounds: a capped neighbour must pass :meth:`within_budget`
        (6 threads at a measured 0.700000000000008 cores each on 4.2 cores did not, and
        the climb, offered no other step up, settled at 2 of them).
        """
        if per_worker <= 0:
            return None
        return int(self.budget.cpus * CPU_SLACK / per_worker + 1e-9)

    def within_budget(self, config: Config, cores_per_worker: float) -> bool:
        """Whether ``config`` stays within the budget, at the CPU use measured per worker."""
        budget = self.budget
        if config.family in self._failed_kinds or config.kind in self._failed_kinds:
            return False
        cpu_cap = self._cpu_cap(cores_per_worker)
        if cpu_cap is not None and config.workers > cpu_cap:
            return False
        if config.kind == "threads":
            return config.workers <= budget.max_threads
        return (
            config.processes <= budget.max_processes
            and config.processes * self._resident <= budget.memory_bytes
            and config.outputs_in_flight * self._largest_output <= budget.shared_memory_bytes
        )

    def rejected(self, config: Config, reason: str) -> None:
        self._tried.add(config)
        self._waiting = None
        if config.chunk_size is None:  # e.g. a pipeline that cannot go to processes, or economic
            self._failed_kinds.add(config.family)
        at = round(self._clock() - self._origin, 3)
        self.trials.append(Trial(config, at, 0.0, 0.0, 0.0, f"failed to start: {reason}"))

    def report(self) -> dict[str, Any]:
        return {
            "settled": self.settled,
            "best": None if self.best is None else self.best[0].to_dict(),
            "trials": [
                {**trial.__dict__, "config": trial.config.to_dict()} for trial in self.trials
            ],
        }


def _strategy_moves(best: Config) -> list[Config]:
    """From classic processes: chunked and economic; from chunked: twice and half the chunk."""
    if best.kind != "processes":
        return []
    if best.strategy == "classic":
        return [
            dataclasses.replace(best, strategy="chunked"),
            dataclasses.replace(best, strategy="economic"),
        ]
    if best.strategy == "chunked" and best.chunk_size is not None:
        size = best.chunk_size
        moves = [dataclasses.replace(best, chunk_size=2 * size)]
        if size > 1:
            moves.append(dataclasses.replace(best, chunk_size=size // 2))
        return moves
    return []
