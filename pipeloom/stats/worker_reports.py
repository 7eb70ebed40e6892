"""A new worker process reports to the loader that started it, however it was started.

Worker processes find their loader's report directory in ``PIPELOOM_STATS_DIR``
(see ``_sampler``). A process forked by a fork server (``forkserver``, a spawn
template) inherits the server's environment, not its loader's: no report
directory, or an earlier loader's. So the target it runs carries its loader's.
"""

from __future__ import annotations

import os
from typing import Any

from ._sampler import ENV_DIR, report_to

__all__ = ["ReportingTarget", "reporting"]


class ReportingTarget:
    """A worker process's target that first points the process's reports at its loader."""

    def __init__(self, target: Any, report_to: str | None) -> None:
        self.target = target
        self.report_to = report_to

    def __call__(self, *args: Any) -> Any:
        report_to(self.report_to)
        return self.target(*args)


def reporting(target: Any) -> Any:
    """``target`` for a new worker process, reporting where this process's loader asks now.

    Example:
        >>> import multiprocessing
        >>> process = multiprocessing.Process(target=reporting(print), args=("hi",))
    """
    return ReportingTarget(target, os.environ.get(ENV_DIR))
