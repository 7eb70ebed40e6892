"""Economic: memory bounded by ``prefetch_factor`` batches, whatever ``num_workers`` is.

The sharding point and its upstream (a shuffled file list, the indices of a
map-style dataset) run in the main process. Each item goes to the item worker
with the fewest items in flight, and each batch to the batch worker with the
fewest batches (``dispatch/dispatcher.py`` decides, with
``dispatch/least_loaded.py``). Item workers run the per-item blocks
(``dispatch/item_worker.py``); the batch worker receives the batch's items
from whichever item workers made them and runs ``batch`` and the per-item
blocks after it, e.g. ``collate`` (``dispatch/batch_worker.py``). The main
process keeps at most ``prefetch_factor`` batches in flight across all
workers, so the first batch is built by up to ``batch_size`` workers at once
and shared memory holds about ``prefetch_factor + 1`` batches.

Without batch workers (``num_batch_workers=0``, the default when
``prefetch_factor`` batches in flight keep the cores busy) a batch's items
are one task for the least loaded item worker, which also runs ``batch`` and
what follows and sends the batch to the main process: still at most
``prefetch_factor`` batches in flight, and no item crosses processes twice.

Needs ``.batch(n)`` right after the per-item blocks, each of which must yield
exactly one output per input (``planning/cut.py`` refuses the rest, naming
the block).
"""

from __future__ import annotations

from .dispatch.runner import DispatchRunner

__all__ = ["EconomicRunner"]


class EconomicRunner(DispatchRunner):
    """Run an economic plan: items to item workers, batches to batch workers (or whole
    batches to item workers when the plan has no batch workers)."""

    per_item_tasks = True
