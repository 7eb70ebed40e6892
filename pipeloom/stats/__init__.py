"""Where a loader's time goes: ``loader.stats()`` and the records it returns.

Turn statistics on with ``DataLoader(..., stats=True)``; ``loader.stats()``
then returns a frozen :class:`LoaderStats`: throughput, the consumer's wait
and which stage it is attributed to, the loader's readiness, a verdict.
:class:`Headspace` replays cached outputs to measure the loop's best-case step.

Example:
    >>> import pipeloom
    >>> from pipeloom.datapipes import IterableWrapper
    >>> with pipeloom.DataLoader(IterableWrapper(range(8)).batch(2), stats=True) as loader:
    ...     batches = list(loader)
    ...     report = loader.stats()
    >>> report.outputs
    4
    >>> report.verdict.split(":")[0] in ("loader-bound", "consumer-bound")
    True
"""

from ._headspace import Headspace
from ._queues import QueueStats
from ._report import LoaderStats, ProcessUse, RankStats, StageStats, TimelinePoint
from ._resources import shared_memory_in_use

__all__ = [
    "Headspace",
    "LoaderStats",
    "ProcessUse",
    "QueueStats",
    "RankStats",
    "StageStats",
    "TimelinePoint",
    "shared_memory_in_use",
]
