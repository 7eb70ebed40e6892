"""A worker process leaves the job's end-of-run signals to its main process.

Schedulers signal every process of a job to say it ends soon (SLURM, ``kill
-- -PGID``). A training loop that handles such a signal in Python -- set a
flag, save a checkpoint, exit -- means it for its main process only: a forked
worker would run that handler on its fork-time copy of the loop (save a stale
loader state over the checkpoint, exit in the middle of an item), and a worker
started by spawn or a fork server would die of the signal's default action,
failing the ``next()`` the loop is waiting in. So a worker drops each such
signal: it keeps serving until the loader stops it, or sees its main process
gone. It drops it with a handler, not ``SIG_IGN``, so that programs it runs get
the default action back. Signals the main process leaves at their default end
the workers as they end it.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

__all__ = ["JOB_SIGNALS", "LeavingJobSignals", "leaving_job_signals"]

JOB_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP")
    if hasattr(signal, name)
)


def _left_to_the_main_process(signum: int, frame: FrameType | None) -> None:
    """A job signal in a worker: its main process handles it."""


class LeavingJobSignals:
    """A worker process's target that first drops the job signals its main process handles."""

    def __init__(self, target: Any, signals: tuple[int, ...]) -> None:
        self.target = target
        self.signals = signals

    def __call__(self, *args: Any) -> Any:
        for signum in self.signals:
            signal.signal(signum, _left_to_the_main_process)
        return self.target(*args)


def leaving_job_signals(target: Any) -> LeavingJobSignals:
    """``target`` for a new worker process, dropping the job signals handled here now.

    Example:
        >>> import multiprocessing
        >>> process = multiprocessing.Process(target=leaving_job_signals(print), args=("hi",))
    """
    handled = tuple(s for s in JOB_SIGNALS if callable(signal.getsignal(s)))
    return LeavingJobSignals(target, handled)
