"""Everything in the calling thread: the default, and the reference for determinism."""

from __future__ import annotations

from ...datapipes import IterDataPipe
from ...graph import Plan
from ..planning.planner import Settings, make_plan
from ..strategies.in_process import InProcessRunner
from ..strategies.runner import Runner
from .base import PlannedService

__all__ = ["InProcessReadingService"]


class InProcessReadingService(PlannedService):
    """Run the whole pipeline in the thread that iterates the loader.

    Best for debugging (breakpoints and tracebacks are plain) and for
    pipelines whose work is already cheap. Blocks marked
    ``is_separate_process()`` run in the calling thread too.

    Example:
        >>> from pipeloom import DataLoader
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(DataLoader(IterableWrapper(range(3)), InProcessReadingService()))
        [0, 1, 2]
    """

    def plan(self, pipeline: IterDataPipe) -> Plan:
        return make_plan(pipeline, Settings("in-process", outer=self.outer))

    def make_runner(self, pipeline: IterDataPipe) -> Runner:
        return InProcessRunner(pipeline, self.plan(pipeline))

    def __repr__(self) -> str:
        return "InProcessReadingService()"
