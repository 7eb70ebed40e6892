"""Reading services: where the blocks of a pipeline run.

Example:
    >>> from pipeloom import DataLoader
    >>> from pipeloom.datapipes import IterableWrapper
    >>> from pipeloom.reading_service import InProcessReadingService
    >>> list(DataLoader(IterableWrapper("ab"), InProcessReadingService()))
    ['a', 'b']
"""

from ._base import ReadingService
from ._distributed import DistributedReadingService
from ._in_process import InProcessReadingService
from ._processes import MultiProcessingReadingService
from ._sequential import SequentialReadingService
from ._threads import ThreadReadingService
from ._worker_info import WorkerInfo, get_worker_info

__all__ = [
    "DistributedReadingService",
    "InProcessReadingService",
    "MultiProcessingReadingService",
    "ReadingService",
    "SequentialReadingService",
    "ThreadReadingService",
    "WorkerInfo",
    "get_worker_info",
]
