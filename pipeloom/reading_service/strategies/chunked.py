"""Chunked: one batch split into chunks built by several workers, put together in order.

The sharding point and its upstream run in the main process, which cuts the
stream into runs of ``chunk_size`` consecutive items (by default a batch
spread evenly over the workers) and gives each chunk to the item worker with
the fewest items in flight (``dispatch/dispatcher.py`` with
``dispatch/least_loaded.py``). The worker runs the per-item blocks on it
(filters and flatmaps allowed) and sends the chunk back
(``dispatch/item_worker.py``); the main process reassembles chunks strictly
in order and runs ``batch``, ``collate`` and the rest. The first batch (and
batches of large items) arrive about ``num_workers`` times sooner.

When the per-item blocks yield one output per input, only an epoch's first
batch goes out in chunks (the main process batches it); every later batch is
one task for one item worker, which also runs ``batch`` and ``collate``, as
economic without batch workers does, so the main process works per batch.

When they may drop or multiply items (a tar reader, ``webdataset()``, a
filter), every batch goes out in chunks, and each chunk's worker builds and
collates the batches its chunk completes, relaying the items that do not
fill one to the next chunk's worker (``dispatch/relay.py``): the main process
reads whole batches there too.

Needs ``.batch(n)`` right after the per-item blocks; ``chunk_size`` is at
most the batch size.
"""

from __future__ import annotations

from .dispatch.runner import DispatchRunner

__all__ = ["ChunkedRunner"]


class ChunkedRunner(DispatchRunner):
    """Run a chunked plan: whole chunks to the least loaded item worker, batches in main."""

    per_item_tasks = False
