"""What the autotuner chooses (:class:`Config`) and the limits it stays within (:class:`Budget`)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from .._validate import check_choice, check_int
from ..errors import StateError
from ..reading_service import (
    MultiProcessingReadingService,
    ReadingService,
    ThreadReadingService,
)

__all__ = ["Budget", "Config"]

KINDS = ("threads", "processes")


@dataclass(frozen=True)
class Config:
    """One placement the tuner can run: worker threads or processes, how many, how far ahead.

    Every ``Config`` runs the classic cut (``strategies/classic/``), so a
    checkpoint taken under one resumes exactly under any other: that is what
    lets the tuner re-place an epoch between two batches.

    Args:
        kind: ``"threads"`` or ``"processes"``.
        workers: how many (at least 1).
        prefetch: outputs each worker may hold ahead of the consumer (at least 1).

    Example:
        >>> Config("processes", 2, 4).service()
        MultiProcessingReadingService(num_workers=2, prefetch_factor=4, start_method=None, \
persistent_workers=True, strategy='classic')
    """

    kind: str
    workers: int
    prefetch: int = 2

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, KINDS)
        check_int("workers", self.workers, minimum=1, hint="the tuner always runs workers")
        check_int("prefetch", self.prefetch, minimum=1, hint="it counts outputs per worker")

    def service(self) -> ReadingService:
        """A fresh reading service running this configuration."""
        if self.kind == "threads":
            return ThreadReadingService(self.workers, prefetch_factor=self.prefetch)
        return MultiProcessingReadingService(
            self.workers, prefetch_factor=self.prefetch, persistent_workers=True
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
        if self.workers > most:
            raise ValueError(
                f"start=Config({self.kind!r}, {self.workers}) asks for {self.workers} worker "
                f"{self.kind}, but the budget allows at most {most} (Budget.{field}); start "
                f"with fewer, or raise the budget: Budget.of_this_machine({field}={self.workers})"
            )

    @classmethod
    def from_dict(cls, saved: Any) -> Config:
        """The configuration :meth:`to_dict` saved; ``StateError`` when it is damaged."""
        try:
            if not isinstance(saved, dict) or set(saved) != {"kind", "workers", "prefetch"}:
                raise ValueError(f"expected a dict with kind, workers and prefetch, got {saved!r}")
            return cls(saved["kind"], saved["workers"], saved["prefetch"])
        except (TypeError, ValueError) as error:
            raise StateError(
                f"the state's autotuned configuration is damaged: {error}; resume from an "
                f"undamaged checkpoint, or drop its 'autotune' entry to start tuning afresh"
            ) from None

    def __str__(self) -> str:
        return f"{self.workers} worker {self.kind}, prefetch {self.prefetch}"


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
