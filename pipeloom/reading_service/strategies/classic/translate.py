"""A classic checkpoint in the other classic shape: batches built in the main process or in workers.

The classic strategy runs in one of two shapes. Workers that yield items
(threads always; processes when the per-item part is one to one) leave
``batch`` and ``collate`` to the main process, which reads them through a
:class:`~.merge.WorkerMerge`; whole-batch workers (``assemble.py``) build
the batches and the main process reads them through a
:class:`~.batch_merge.BatchMerge`. Both resume from the same point: a
position at the sharding point and how many of its outputs were delivered
(``WorkerMerge``: ``position``/``delivered_here``; ``BatchMerge``:
``position``/``skip``). When the blocks that change sides hold nothing
(between two batches they do not), a checkpoint of one shape is exactly one
of the other, so moving between threads and processes (autotune, or a user
who changes service) needs no replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ....datapipes import IterableWrapper, IterDataPipe, pipeline_state_dict, reset_pipeline
from ....graph import copy, upstream

__all__ = ["fresh_states", "translated"]

_ITEMS = "WorkerMerge"
_BATCHES = "BatchMerge"


def translated(
    state: dict[str, Any],
    fresh: Callable[[], list[dict[str, Any]]],
    own: IterDataPipe,
    group_size: int,
) -> dict[str, Any]:
    """``state`` in the shape of ``own`` (the main process's copy), or ``state`` unchanged.

    Args:
        state: a classic main part's checkpoint (``{"kind": "workers", "tail": ...}``).
        fresh: the pipeline's :func:`fresh_states` (called only where the shapes differ).
        own: the main process's copy this runner reads the workers through.
        group_size: this runner's sharding group size (a ``WorkerMerge`` resumes
            only at a group's first position).

    Anything it cannot translate exactly is returned unchanged: the main part
    then refuses it as another service's state (and the loader replays).
    """
    tail = state.get("tail") if isinstance(state, dict) else None
    if not isinstance(tail, dict):
        return state
    saved = tail.get("blocks")
    if not isinstance(saved, list) or not saved or not all(isinstance(e, dict) for e in saved):
        return state
    saved_types = [entry.get("type") for entry in saved]
    own_types = [type(block).__qualname__ for block in upstream(own)]
    if saved_types == own_types or len(own_types) < 1:
        return state
    merge = saved[-1].get("state")
    if not isinstance(merge, dict) or "rest" in merge:  # the rest of an elastic resume stays
        return state
    if saved_types[-1] == _ITEMS and own_types[-1] == _BATCHES:
        blocks = _to_batches(saved, own_types, fresh(), merge)
    elif saved_types[-1] == _BATCHES and own_types[-1] == _ITEMS:
        blocks = _to_items(saved, own_types, fresh(), merge, group_size)
    else:
        blocks = None
    if blocks is None:
        return state
    return {**state, "tail": {**tail, "blocks": blocks}}


def fresh_states(pipeline: IterDataPipe, point: Any) -> list[dict[str, Any]]:
    """Each block after the sharding point ``point`` at an epoch's start, output first
    (a copy of them is made: compute it once per pipeline)."""
    fresh = copy(pipeline, replace={point: IterableWrapper([])})  # not what feeds it
    reset_pipeline(fresh)
    return list(pipeline_state_dict(fresh)["blocks"])


def _same(entries: list[dict[str, Any]], reference: list[dict[str, Any]]) -> bool:
    pairs = [(e.get("type"), e.get("state")) for e in entries]
    return pairs == [(e.get("type"), e.get("state")) for e in reference]


def _to_batches(
    saved: list[dict[str, Any]],
    own_types: list[str],
    fresh: list[dict[str, Any]],
    merge: dict[str, Any],
) -> list[dict[str, Any]] | None:
    """Items merged in the main process -> whole batches from workers."""
    head = len(own_types) - 1
    moved = saved[head:-1]  # batch, collate, ...: now in the workers
    if [e.get("type") for e in saved[:head]] != own_types[:head]:
        return None
    if not moved or not _same(moved, fresh[head : head + len(moved)]):
        return None  # a block changing sides holds something (mid-batch): not exact
    position, delivered = merge.get("position"), merge.get("delivered_here")
    if not (isinstance(position, int) and isinstance(delivered, int)):
        return None
    resume = {"position": position, "skip": delivered}
    return [*saved[:head], {"type": _BATCHES, "state": resume}]


def _to_items(
    saved: list[dict[str, Any]],
    own_types: list[str],
    fresh: list[dict[str, Any]],
    merge: dict[str, Any],
    group_size: int,
) -> list[dict[str, Any]] | None:
    """Whole batches from workers -> items merged in the main process."""
    head = len(saved) - 1
    if own_types[:head] != [e.get("type") for e in saved[:head]]:
        return None
    moved = fresh[head : len(own_types) - 1]  # now in the main process, at rest
    if [e.get("type") for e in moved] != own_types[head:-1]:
        return None
    position, skip = merge.get("position"), merge.get("skip")
    if not (isinstance(position, int) and isinstance(skip, int)) or position % group_size:
        return None  # a WorkerMerge resumes at a group's first position only
    resume = {"position": position, "delivered_here": skip}
    return [*saved[:head], *moved, {"type": _ITEMS, "state": resume}]
