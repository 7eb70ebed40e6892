"""Queues that join two placed parts of a pipeline: ``DataLoaderQueue`` and kin.

Implementations, by where the two endpoints live:

=================  ======================  ==========================================
class              endpoints               how items cross
=================  ======================  ==========================================
``LocalQueue``     one thread              by reference
``ThreadQueue``    two threads             by reference
``ProcessQueue``   two processes           pickle 5; tensors/arrays via shared memory
=================  ======================  ==========================================

:func:`make_queue` picks one from two :class:`Location` objects.

Exceptions (``NotAvailable`` and ``QueueError`` come from ``pipeloom.errors``)::

    Exception
    ├── NotAvailable           block=False and the queue is empty / full; try later
    ├── TimeoutError           (builtin) a timeout expired first; never returns None
    ├── TypeError              (builtin) put() of an item that cannot be pickled
    ├── OSError                (builtin) ProcessQueue: no shared memory to be had for
    │                           an item (put: nothing sent; get: that item is lost)
    ├── RuntimeError           (builtin) misuse: a third endpoint, a blocking call
    │                           that could never return (LocalQueue), ...
    └── PipeloomError
        └── QueueError
            ├── QueueClosed    closed on purpose (by you or the peer); for a
            │                  consumer, raised only after the queue is drained
            └── QueueBroken    the peer died without closing; names the peer

Example:
    >>> from pipeloom.queues import Location, make_queue
    >>> q = make_queue(Location("main"), Location("main", thread="loader"))
    >>> type(q).__name__
    'ThreadQueue'
"""

from pipeloom.queues._base import (
    DataLoaderQueue,
    QueueBroken,
    QueueClosed,
    QueueState,
    QueueStatistics,
)
from pipeloom.queues._factory import Location, make_queue
from pipeloom.queues._local import LocalQueue
from pipeloom.queues._process import ALLOCATE_MIN, ProcessQueue
from pipeloom.queues._serialize import PayloadError, encode
from pipeloom.queues._thread import ThreadQueue

__all__ = [
    "ALLOCATE_MIN",
    "DataLoaderQueue",
    "LocalQueue",
    "Location",
    "PayloadError",
    "ProcessQueue",
    "QueueBroken",
    "QueueClosed",
    "QueueState",
    "QueueStatistics",
    "ThreadQueue",
    "encode",
    "make_queue",
]
