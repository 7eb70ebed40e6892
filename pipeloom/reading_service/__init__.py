"""Reading services: where the blocks of a pipeline run.

The public names are the ones below; the subpackages are the services'
internals, grouped by role:

* ``services/``: the public services, thin facades that validate their
  arguments, plan once and delegate to a runner.
* ``planning/``: one :class:`~pipeloom.graph.Plan` per loader, cut from the
  blocks' traits (``cut.py``, ``planner.py``, ``sharding.py``).
* ``strategies/``: one runner per strategy behind one interface
  (``runner.py``): ``in_process.py``, ``classic/``, ``economic.py``,
  ``chunked.py`` (the last two share ``dispatch/``), ``ray_actors/`` (classic
  workers as Ray actors, ``pipeloom[ray]``).
* ``workers/``: worker processes (``process.py``: start, watch, stop) and
  threads (``thread.py``), one epoch of a replica (``epoch.py``), the
  messages between them and the main process (``messages.py``).
* ``distributed/``: a ``torch.distributed`` job and one rank's epoch.

Example:
    >>> from pipeloom import DataLoader
    >>> from pipeloom.datapipes import IterableWrapper
    >>> from pipeloom.reading_service import InProcessReadingService
    >>> list(DataLoader(IterableWrapper("ab"), InProcessReadingService()))
    ['a', 'b']
"""

from .distributed.elastic import merge_rank_states
from .services.base import ReadingService
from .services.distributed import DistributedReadingService
from .services.in_process import InProcessReadingService
from .services.processes import MultiProcessingReadingService
from .services.ray_actors import RayReadingService
from .services.sequential import SequentialReadingService
from .services.threads import ThreadReadingService
from .workers.info import WorkerInfo, get_worker_info

__all__ = [
    "DistributedReadingService",
    "InProcessReadingService",
    "MultiProcessingReadingService",
    "RayReadingService",
    "ReadingService",
    "SequentialReadingService",
    "ThreadReadingService",
    "WorkerInfo",
    "get_worker_info",
    "merge_rank_states",
]
