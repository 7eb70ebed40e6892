"""``AutoReadingService``: a reading service that re-places the pipeline while it runs.

It runs one configuration at a time (:class:`~pipeloom.autotune.Config`:
worker threads or processes, how many, how far ahead, which strategy)
through the built-in services. When its tuner picks another configuration
of the classic cut, it re-places the epoch between two outputs: it takes the
running service's checkpoint, stops it, and resumes that checkpoint under
the new configuration (classic checkpoints are portable between threads and
processes and any number of workers). A move to economic or chunked, or to
another chunk size, starts with the next epoch, and so does any move when
the running service cannot take a checkpoint (a block without
``state_dict()``). pipeloom's order does not
depend on placement, so the output is the untuned run's, output for output.
"""

from __future__ import annotations

import dataclasses
import os
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..datapipes import IterDataPipe
from ..errors import StateError
from ..graph import Placement
from ..reading_service import InProcessReadingService, ReadingService
from ..reading_service.planning.cut import PlanError
from ..stats.counters import ENV_DIR
from ._config import Budget, Config
from ._tuner import HillClimb, Tuner

__all__ = ["AutoReadingService", "as_reading_service", "tuned_in"]


class AutoReadingService(ReadingService):
    """Choose and adjust threads or processes, worker count, prefetch and strategy as it runs.

    ``DataLoader(pipe, reading_service="auto")`` builds one with the defaults.
    The tuner (:class:`~pipeloom.autotune.HillClimb` by default) measures
    each configuration on the outputs the consumer receives and re-places the
    pipeline between two outputs; the items and their order stay those of
    the in-process run. ``loader.stats()`` reports what it chose and tried
    (``stats.autotune``), and ``loader.state_dict()`` saves the choice so a
    resumed job starts tuned.

    Args:
        start: the first configuration (default: threads, one per core, prefetch 2).
        budget: the resources the tuner may use (default: :meth:`Budget.of_this_machine`).
        tuner: decides the configurations (default: a :class:`HillClimb` on ``budget``).

    A pipeline without a sharding point cannot be split between workers: it
    runs in-process and nothing is tuned (``stats.autotune`` says so). A
    ``start`` on a strategy the pipeline cannot run is listed in ``failures``,
    and the run starts on classic processes of the same count.

    Example:
        >>> from pipeloom import DataLoader
        >>> from pipeloom.datapipes import IterableWrapper
        >>> pipe = IterableWrapper(range(8)).sharding_filter().map(lambda x: x * 10).batch(4)
        >>> with DataLoader(pipe, AutoReadingService(), seed=0) as loader:
        ...     list(loader)
        [[0, 10, 20, 30], [40, 50, 60, 70]]
    """

    def __init__(
        self,
        *,
        start: Config | None = None,
        budget: Budget | None = None,
        tuner: Tuner | None = None,
    ) -> None:
        if start is not None and not isinstance(start, Config):
            raise TypeError(f"start must be a pipeloom.autotune.Config, got {start!r}")
        if budget is not None and not isinstance(budget, Budget):
            raise TypeError(f"budget must be a pipeloom.autotune.Budget, got {budget!r}")
        if tuner is not None and not isinstance(tuner, Tuner):
            raise TypeError(f"tuner must be a pipeloom.autotune.Tuner, got {tuner!r}")
        self.budget = budget if budget is not None else Budget.of_this_machine()
        if start is not None:
            start.check_within(self.budget)
        self.config = start if start is not None else Config("threads", self.budget.cpus, 2)
        self.tuner = tuner if tuner is not None else HillClimb(self.budget)
        self.replacements = 0
        self.pending: Config | None = None  # the tuner's choice, applied before the next output
        # Why this epoch cannot move before its end (a block cannot save its state), if so.
        self.held_to_epoch: str | None = None
        self.failures: list[str] = []  # configurations that could not start, and why
        self._pipeline: IterDataPipe | None = None
        self._inner: ReadingService | None = None
        self._running: Config | None = None  # the configuration self._inner runs
        self._outer = (1, 0)
        self._untunable: str | None = None
        self._stats_dir: str | None = None
        # Called before a configuration's workers stop and after new ones start (the
        # loader's statistics read the queues: the last messages of the old ones, and the
        # new ones, which may stop again before the next periodic sample). Held weakly:
        # the statistics hold this service (its queues()), a cycle would keep both alive.
        self.on_queues_change: weakref.WeakMethod[Callable[[], None]] | None = None

    # -- the ReadingService interface ---------------------------------------------------
    def set_outer_sharding(self, total: int, index: int) -> None:
        self._outer = (total, index)

    def initialize(self, pipeline: IterDataPipe) -> None:
        self._pipeline = pipeline
        try:
            try:
                self._place(self.config)
            except PlanError as error:
                if self.config.strategy == "classic":
                    raise
                # Economic or chunked cannot run this pipeline (a filter before an economic
                # batch): start from classic processes, which run any pipeline that shards.
                classic = Config(self.config.kind, self.config.workers, self.config.prefetch)
                self._refused(self.config, error)
                self._place(classic)
        except PlanError as error:
            self._untunable = f"runs in-process, nothing to tune: {error}"
            inner = InProcessReadingService()
            self._configure(inner)
            inner.initialize(pipeline)
            self._inner = inner

    def start_epoch(self, epoch: int, state: dict[str, Any] | None = None) -> Iterator[Any]:
        inner = self._require_inner()
        self._stats_dir = os.environ.get(ENV_DIR)  # set by a loader collecting statistics
        if self._untunable is not None:
            return inner.start_epoch(epoch, state)
        self.held_to_epoch = None
        if self.pending is not None:  # decided in the previous epoch (or at its last output)
            items = self._start_pending(epoch, state)
        else:
            if self._running != self.config:
                self._place(self.config)
            items = self._require_inner().start_epoch(epoch, state)
        self.tuner.start(self.config)
        return _TunedEpoch(self, epoch, items)

    def _start_pending(self, epoch: int, state: dict[str, Any] | None) -> Iterator[Any]:
        """Start the epoch under the tuner's choice; if it cannot start, under the last one."""
        config, self.pending = self.pending, None
        assert config is not None
        running = self.config
        try:
            items = self._resume(config, epoch, state)
        except Exception as error:  # noqa: BLE001 - e.g. a strategy this pipeline cannot run
            self._refused(config, error)
            return self._resume(running, epoch, state)
        return items

    def _refused(self, config: Config, error: Exception) -> None:
        """``config`` could not start: say so in ``failures`` and to the tuner."""
        self.failures.append(f"{config}: {type(error).__name__}: {error}")
        self.tuner.rejected(config, f"{type(error).__name__}: {error}")

    def state_dict(self) -> dict[str, Any]:
        return self._require_inner().state_dict()

    def queues(self) -> Sequence[tuple[str, Any]]:
        return () if self._inner is None else self._inner.queues()

    def placement(self) -> Placement:
        return self._require_inner().placement()

    def shutdown(self) -> None:
        if self._inner is not None:
            self._inner.shutdown()

    # -- what the loader saves and reports ------------------------------------------------
    def tuning_state(self) -> dict[str, Any]:
        """The chosen configuration, for the loader's ``state_dict()``."""
        return {"config": self.config.to_dict(), "settled": bool(self.tuner.settled)}

    def load_tuning_state(self, saved: dict[str, Any]) -> None:
        """Start from a saved choice (the loader's ``load_state_dict()``)."""
        config = Config.from_dict(saved.get("config") if isinstance(saved, dict) else None)
        fitted = config.fitted_to(self.budget)  # saved on a larger machine, maybe
        self.config, self.pending = fitted, None
        if fitted != config:
            budget = self.budget
            self.failures.append(
                f"{config} (the saved choice): beyond this budget (at most "
                f"{budget.max_threads} threads, {budget.max_processes} processes); resumed on "
                f"{fitted}, tuning again"
            )
        elif saved.get("settled"):
            self.tuner.resume(config)

    def autotune_report(self) -> dict[str, Any]:
        """What runs now, and what the tuner measured and decided (``stats().autotune``)."""
        return {
            "config": None if self._untunable else self.config.to_dict(),
            "chosen": self._untunable or str(self.config),
            "replacements": self.replacements,
            "failures": list(self.failures),
            "budget": self.budget.to_dict(),
            **self.tuner.report(),
        }

    # -- re-placement ---------------------------------------------------------------------
    def _place(self, config: Config) -> None:
        """Stop the running service (if any) and initialize one for ``config``."""
        assert self._pipeline is not None
        if self._inner is not None:  # kept until replaced: placement() may be asked meanwhile
            self._queues_change()
            self._inner.shutdown()
        inner = config.service()
        self._configure(inner)
        inner.initialize(self._pipeline)
        if config.strategy == "chunked" and config.chunk_size is None:  # what the plan chose
            unit = getattr(inner.placement(), "unit", None)
            if unit is not None:
                config = dataclasses.replace(config, chunk_size=unit[1])
        self._inner, self._running, self.config = inner, config, config

    def _configure(self, inner: ReadingService) -> None:
        if self._outer != (1, 0):
            inner.set_outer_sharding(*self._outer)

    def replace(self, config: Config, epoch: int, items: Iterator[Any]) -> Iterator[Any]:
        """Continue ``epoch`` under ``config`` from the running service's checkpoint.

        If ``config`` cannot start (e.g. the pipeline cannot be sent to worker
        processes), the epoch goes on where it was, and the tuner is told.
        """
        running = self.config
        try:
            state = self._require_inner().state_dict()
        except StateError as error:  # e.g. a block without state_dict(): no exact resume point
            self.held_to_epoch = str(error)
            self.pending = config  # starts with the next epoch, as a move to another strategy
            self.tuner.deferred(config)
            return items
        # Stop the workers first: closing the epoch first would make persistent workers
        # end it cleanly (a wait) only to be stopped.
        self._queues_change()
        self._require_inner().shutdown()
        close = getattr(items, "close", None)
        if close is not None:
            close()
        try:
            resumed = self._resume(config, epoch, state)
        except Exception as error:  # noqa: BLE001 - any start-up failure: go back
            self._refused(config, error)
            resumed = self._resume(running, epoch, state)
            self.tuner.start(running)
            return resumed
        self.replacements += 1
        self.tuner.start(config)
        return resumed

    def _resume(self, config: Config, epoch: int, state: dict[str, Any] | None) -> Iterator[Any]:
        previous = os.environ.get(ENV_DIR)
        if self._stats_dir is not None:  # new worker processes report to the loader too
            os.environ[ENV_DIR] = self._stats_dir
        try:
            self._place(config)
            items = self._require_inner().start_epoch(epoch, state)
            self._queues_change()
            return items
        finally:
            if self._stats_dir is not None:
                if previous is None:
                    os.environ.pop(ENV_DIR, None)
                else:
                    os.environ[ENV_DIR] = previous

    def _queues_change(self) -> None:
        hook = None if self.on_queues_change is None else self.on_queues_change()
        if hook is not None:
            hook()

    def _require_inner(self) -> ReadingService:
        if self._inner is None:
            raise RuntimeError("AutoReadingService used before initialize(pipeline)")
        return self._inner

    def __repr__(self) -> str:
        return f"AutoReadingService(running={self.config})"


def as_reading_service(given: Any) -> ReadingService:
    """The service ``DataLoader(pipe, given)`` runs: ``None`` in-process, ``"auto"`` tuned.

    Example:
        >>> as_reading_service("auto")
        AutoReadingService(running=...)
    """
    if given is None:
        return InProcessReadingService()
    if isinstance(given, str) and given == "auto":
        return AutoReadingService()
    if not isinstance(given, ReadingService):
        got = repr(given) if isinstance(given, str) else type(given).__name__
        raise TypeError(
            f"reading_service must be a ReadingService such as InProcessReadingService() or "
            f'MultiProcessingReadingService(4), or "auto", got {got}'
        )
    return given


def tuned_in(service: ReadingService) -> AutoReadingService | None:
    """The ``AutoReadingService`` that ``service`` is or chains (``SequentialReadingService``).

    Example:
        >>> tuned_in(InProcessReadingService()) is None
        True
    """
    for candidate in (service, *getattr(service, "services", ())):
        if isinstance(candidate, AutoReadingService):
            return candidate
    return None


class _TunedEpoch(Iterator[Any]):
    """One epoch's outputs; each delivery is shown to the tuner, which may re-place the rest."""

    def __init__(self, service: AutoReadingService, epoch: int, items: Iterator[Any]) -> None:
        self._service = service
        self._epoch = epoch
        self._items = items

    def __next__(self) -> Any:
        service = self._service
        pending = service.pending
        if (
            pending is not None
            and service.held_to_epoch is None
            and pending.moves_within_epoch(service.config)
        ):
            service.pending = None  # between two outputs: the checkpoint is exact here
            self._items = service.replace(pending, self._epoch, self._items)
        called = time.perf_counter()
        item = next(self._items)
        returned = time.perf_counter()
        decision = service.tuner.observe(returned, returned - called, _nbytes(item))
        if decision is not None and decision != service.config:
            service.pending = decision
            if service.held_to_epoch is not None or not decision.moves_within_epoch(service.config):
                service.tuner.deferred(decision)  # from the next epoch
        return item

    def close(self) -> None:
        close = getattr(self._items, "close", None)
        if close is not None:
            close()


def _nbytes(output: Any, depth: int = 0) -> int:
    """Roughly the bytes an output takes (tensors, arrays, bytes; containers one level deep)."""
    size = getattr(output, "nbytes", None)
    if isinstance(size, int):
        return size
    if isinstance(output, (bytes, bytearray, memoryview)):
        return len(output)
    if depth < 2 and isinstance(output, dict):
        output = list(output.values())
    if depth < 2 and isinstance(output, (list, tuple)) and output:
        sampled = output[:16]  # a long batch: its first elements, scaled
        return sum(_nbytes(x, depth + 1) for x in sampled) * len(output) // len(sampled)
    return 64
