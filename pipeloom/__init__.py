"""pipeloom: composable, asynchronous, deterministic data loading for PyTorch.

Example:
    >>> import pipeloom
    >>> from pipeloom.datapipes import IterableWrapper
    >>> pipe = IterableWrapper(range(10)).shuffle().batch(4)
    >>> [len(b) for b in pipeloom.DataLoader(pipe, seed=0)]
    [4, 4, 2]
"""

from . import datapipes, graph, reading_service
from .datapipes import item_rng, item_seed
from .errors import NotAvailable, PipeloomError, QueueError, StateError, WorkerError
from .loader import DataLoader
from .reading_service import InProcessReadingService, get_worker_info

__version__ = "0.1.0"

__all__ = [
    "DataLoader",
    "InProcessReadingService",
    "NotAvailable",
    "PipeloomError",
    "QueueError",
    "StateError",
    "WorkerError",
    "datapipes",
    "get_worker_info",
    "graph",
    "item_rng",
    "item_seed",
    "reading_service",
]
