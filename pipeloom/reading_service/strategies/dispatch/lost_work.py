"""Name the work a dead economic/chunked worker had in hand.

The dispatcher keeps every batch (economic) or chunk (chunked) in flight
with the source positions of its items and the workers it went to. When a
worker process dies (the out-of-memory killer, a crash in a C extension),
the units in flight that it was given items of hold the culprit (it may have
finished its part of the older ones): the error names their positions, so
the user knows which samples to look at.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ....errors import WorkerError
from .units import Unit

__all__ = ["naming_lost_work"]


def naming_lost_work(items: Iterator[Any], dispatcher: Any, units_name: str) -> Iterator[Any]:
    """``items``, with a worker's death naming the units in flight it had items of.

    ``dispatcher.in_flight`` holds the units; the pool labels item worker
    ``i`` ``"item worker {i} (pid ...)"`` and batch worker ``j`` ``"batch worker {j} ..."``.
    """
    try:
        yield from items
    except WorkerError as error:
        _name(error, dispatcher.in_flight, units_name)
        raise


def _name(error: WorkerError, units: Sequence[Unit], units_name: str) -> None:
    if error.original_type is not None or error.item is not None or error.worker is None:
        return  # an error of the worker's own code names its item
    kind, _, number = error.worker.partition(" worker ")
    index = number.split(" ", 1)[0]
    if kind not in ("item", "batch") or not index.isdigit():
        return
    worker = int(index)
    held = [
        unit
        for unit in units
        if unit.positions
        and (
            any(w == worker for w, _ in unit.item_workers)
            if kind == "item"
            else unit.batch_worker == worker
        )
    ]
    if not held:
        return
    ranges = [f"{min(unit.positions)}-{max(unit.positions)}" for unit in held[:4]]
    more = f" and {len(held) - 4} more" if len(held) > 4 else ""
    error.add_detail(
        f". It had been given items of the {units_name} in flight of the items at positions "
        f"{', '.join(ranges)}{more}",
        item=min(held[0].positions),
    )
