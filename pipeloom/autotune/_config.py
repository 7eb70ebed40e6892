"""What the autotuner chooses (:class:`Config`) and the limits it stays within (:class:`Budget`)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from typing import Any

from .._validate import check_choice, check_int
from ..errors import StateError
from ..reading_service import (
    MultiProcessingReadingService,
    ReadingService,
    ThreadReadingService,
)
from ..reading_service.services.processes import default_batch_workers

__all__ = ["Budget", "Config"]

KINDS = ("threads", "processes")
STRATEGIES = ("classic", "economic", "chunked")


@dataclass(frozen=True)
class Config:
    """One placement the tuner can run: threads or processes, how many, how far ahead, how split.

    Configurations of the classic strategy (threads, or processes with
    ``strategy="classic"``) resume each other's checkpoints exactly, so the
    tuner moves between them between two batches. A move to or from economic
    or chunked processes (or another chunk size) waits for the next epoch,
    where no checkpoint has to cross: the output is the same either way.

    Args:
        kind: ``"threads"`` or ``"processes"``.
        workers: how many (at least 1).
        prefetch: outputs each worker may hold ahead of the consumer (at least 1).
        strategy: processes only: ``"classic"``, ``"economic"`` or ``"chunked"``.
        chunk_size: chunked only: items per chunk (None: the strategy's default).

    Example:
        >>> Config("processes", 2, 4).service()
        MultiProcessingReadingService(num_workers=2, prefetch_factor=4, start_method=None, \
persistent_workers=True, strategy='classic')
        >>> str(Config("processes", 2, 2, "chunked", 8))
        '2 worker processes (chunked, chunks of 8), prefetch 2'
    """

    kind: str
    workers: int
    prefetch: int = 2
    strategy: str = "classic"
    chunk_size: int | None = None

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, KINDS)
        check_int("workers", self.workers, minimum=1, hint="the tuner always runs workers")
        check_int("prefetch", self.prefetch, minimum=1, hint="it counts outputs per worker")
        check_choice("strategy", self.strategy, STRATEGIES)
        if self.kind == "threads" and self.strategy != "classic":
            raise ValueError(
                f"strategy={self.strategy!r} splits work between processes; threads run the "
                f"classic strategy: use Config('processes', ..., strategy={self.strategy!r})"
            )
        if self.chunk_size is not None:
            check_int("chunk_size", self.chunk_size, minimum=1, hint="items per chunk")
            if self.strategy != "chunked":
                raise ValueError(
                    f"chunk_size={self.chunk_size} applies to strategy='chunked' only, got "
                    f"strategy={self.strategy!r}; drop chunk_size or use 'chunked'"
                )

    @property
    def family(self) -> str:
        """What a failure to start rules out: the kind of worker (and strategy, if not classic)."""
        return self.kind if self.strategy == "classic" else f"{self.kind} ({self.strategy})"

    @property
    def processes(self) -> int:
        """Worker processes it starts (economic may add ``prefetch`` batch workers)."""
        if self.kind == "threads":
            return 0
        if self.strategy != "economic":
            return self.workers
        return self.workers + default_batch_workers(self.workers, self.prefetch)

    @property
    def outputs_in_flight(self) -> int:
        """Outputs it may hold between processes (economic and chunked: flat in workers)."""
        if self.strategy == "classic":
            return self.workers * self.prefetch
        return self.prefetch + 1

    def moves_within_epoch(self, other: Config) -> bool:
        """Whether an epoch can move from this configuration to ``other`` between two outputs."""
        return self.strategy == other.strategy == "classic"

    def service(self) -> ReadingService:
        """A fresh reading service running this configuration."""
        if self.kind == "threads":
            return ThreadReadingService(self.workers, prefetch_factor=self.prefetch)
        return MultiProcessingReadingService(
            self.workers,
            prefetch_factor=self.prefetch,
            persistent_workers=True,
            strategy=self.strategy,
            chunk_size=self.chunk_size,
        )

    def to_dict(self) -> dict[str, Any]:
        """A plain dict, for ``state_dict()`` and ``stats()``."""
        return asdict(self)

    def check_within(self, budget: Budget) -> None:
        """Raise ``ValueError`` when this configuration's worker count exceeds ``budget``.

        (CPU and memory use are measured once it runs; the tuner keeps within them.)

        Example:
            >>> budget = Budget(2, 2**30, 2**30, 16, 4)
            >>> Config("processes", 8).check_within(budget)  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            ValueError: start=Config('processes', 8) asks for 8 worker processes, ...
        """
        field = "max_threads" if self.kind == "threads" else "max_processes"
        most = getattr(budget, field)
        count = self.workers if self.kind == "threads" else self.processes
        if count > most:
            raise ValueError(
                f"start=Config({self.kind!r}, {self.workers}) asks for {count} worker "
                f"{self.kind}, but the budget allows at most {most} (Budget.{field}); start "
                f"with fewer, or raise the budget: Budget.of_this_machine({field}={count})"
            )

    def fitted_to(self, budget: Budget) -> Config:
        """This configuration with no more workers than ``budget`` allows (itself if it fits).

        Example:
            >>> str(Config("processes", 8, 2).fitted_to(Budget(2, 2**30, 2**30, 16, 4)))
            '4 worker processes, prefetch 2'
        """
        if self.kind == "threads":
            return replace(self, workers=min(self.workers, budget.max_threads))
        fitted = self
        while fitted.processes > budget.max_processes and fitted.workers > 1:
            fitted = replace(fitted, workers=fitted.workers - 1)
        if fitted.processes > budget.max_processes:  # economic's batch workers alone
            fitted = Config("processes", 1, self.prefetch)
        return fitted

    @classmethod
    def from_dict(cls, saved: Any) -> Config:
        """The configuration :meth:`to_dict` saved; ``StateError`` when it is damaged."""
        try:
            required = {"kind", "workers", "prefetch"}
            if not (isinstance(saved, dict) and required <= set(saved) <= {*required, *_OPTIONAL}):
                raise ValueError(
                    f"expected a dict with kind, workers, prefetch (and optionally strategy, "
                    f"chunk_size), got {saved!r}"
                )
            return cls(**saved)
        except (TypeError, ValueError) as error:
            raise StateError(
                f"the state's autotuned configuration is damaged: {error}; resume from an "
                f"undamaged checkpoint, or drop its 'autotune' entry to start tuning afresh"
            ) from None

    def __str__(self) -> str:
        how = ""
        if self.strategy != "classic":
            chunks = "" if self.chunk_size is None else f", chunks of {self.chunk_size}"
            how = f" ({self.strategy}{chunks})"
        return f"{self.workers} worker {self.kind}{how}, prefetch {self.prefetch}"


_OPTIONAL = ("strategy", "chunk_size")


@dataclass(frozen=True)
class Budget:
    """The resources the tuner may use; :meth:`of_this_machine` reads the defaults.

    Attributes:
        cpus: cores the workers may keep busy together (measured CPU use per
            worker times workers must stay within it).
        memory_bytes: resident memory worker processes may add (each new
            process is counted at the main process's resident size, an upper
            bound under fork).
        shared_memory_bytes: shared memory the outputs in flight between
            processes may hold (workers x prefetch x the largest output seen).
        max_threads: worker threads at most (for work that waits, not computes).
        max_processes: worker processes at most.

    Example:
        >>> budget = Budget.of_this_machine()
        >>> budget.cpus >= 1 and budget.max_threads >= budget.cpus
        True
    """

    cpus: int
    memory_bytes: int
    shared_memory_bytes: int
    max_threads: int
    max_processes: int

    def __post_init__(self) -> None:
        for name in ("cpus", "max_threads", "max_processes"):
            check_int(name, getattr(self, name), minimum=1)
        for name in ("memory_bytes", "shared_memory_bytes"):
            check_int(name, getattr(self, name), minimum=0)

    @classmethod
    def of_this_machine(cls, **overrides: int) -> Budget:
        """Defaults from this machine, with ``overrides`` (any field by name).

        ``cpus``: the cores this process may run on (``os.sched_getaffinity``);
        ``memory_bytes``: half the available memory; ``shared_memory_bytes``:
        half of ``/dev/shm``'s free space; ``max_threads``: 8 per core;
        ``max_processes``: 2 per core.
        """
        unknown = set(overrides) - set(cls.__dataclass_fields__)
        if unknown:
            raise TypeError(
                f"unknown budget field(s) {sorted(unknown)}; the fields are "
                f"{sorted(cls.__dataclass_fields__)}"
            )
        cpus = overrides.get("cpus") or _cpus()
        defaults = {
            "cpus": cpus,
            "memory_bytes": _available_memory() // 2,
            "shared_memory_bytes": _free_shared_memory() // 2,
            "max_threads": 8 * cpus,
            "max_processes": 2 * cpus,
        }
        return cls(**{**defaults, **overrides})

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 2**31


def _free_shared_memory() -> int:
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return 2**30
    return stat.f_bavail * stat.f_frsize
