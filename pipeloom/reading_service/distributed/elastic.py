"""Resuming an epoch on another number of ranks: each rank's picture, and the job's.

At ``state_dict()`` each rank describes where it stands at the sharding point
(:func:`rank_picture`): the first group of its shard it has not fully
delivered (its *frontier*) and how many outputs of that group it delivered.
Everything the rank read before its frontier was delivered or is held by a
block after the sharding point: a block that holds items declares it
(``HoldsItems``: shuffle buffers, packing bins, length buckets), and the
picture lists where they are (*held*); any other block that is not at rest
makes the picture inexact, and it names that block (its *blocker*).
:func:`merge_rank_states` joins every rank's loader state into one;
:func:`rest_of_epoch` turns it into the positions no one delivered, which the
new ranks split again (``pipeloom.datapipes.runtime.RestOfEpoch``), and
:func:`held_states` gives every new rank every old rank's held items, of
which its blocks keep their share (``pipeloom.datapipes.runtime.HeldShare``:
each held unit to exactly one new rank, by a rule every rank computes alike).
"""

from __future__ import annotations

from typing import Any

from ...datapipes import (
    IterableWrapper,
    IterDataPipe,
    ShardingFilter,
    reset_pipeline,
    set_pipeline_epoch,
)
from ...datapipes.runtime import HoldsItems, RestOfEpoch
from ...errors import StateError
from ...graph import copy, upstream
from ..services.base import PlannedService, ReadingService
from ..strategies.classic.merge import WorkerMerge
from ..strategies.classic.runner import ClassicRunner
from ..strategies.in_process import InProcessRunner

__all__ = ["held_states", "merge_rank_states", "rank_picture", "rest_of_epoch"]

# The frontier of a rank that was repeating its shard (uneven="pad"): past its last group.
_WHOLE_SHARD = 2**62

_WORKAROUND = (
    "move it before sharding_filter() (every rank then replays it), save the checkpoint at "
    "a step where it holds nothing, or resume on the same number of ranks"
)


def rank_picture(inner: ReadingService, epoch: int) -> dict[str, Any]:
    """This rank's frontier at the sharding point, or the reason there is none.

    Returns ``{"group_size", "frontier", "skip", "blocker", "held", "held_in"}``;
    ``blocker`` is None when the picture is exact, else a sentence for the
    ``StateError`` an elastic resume raises; ``held`` lists the blocks holding
    items (their index among the blocks of the inner state's ``held_in``).
    """
    runner = inner._require_runner() if isinstance(inner, PlannedService) else None
    if isinstance(runner, InProcessRunner):
        return _in_process_picture(runner, epoch)
    if isinstance(runner, ClassicRunner) and runner.plan.strategy in ("classic", "threads"):
        return _classic_picture(runner, epoch)
    strategy = getattr(getattr(runner, "plan", None), "strategy", type(inner).__name__)
    return _blocked(
        f"the {strategy} strategy does not describe its ranks' frontiers; use "
        f"DistributedReadingService alone or followed by ThreadReadingService or "
        f"MultiProcessingReadingService (classic strategy) to resume on another number of ranks"
    )


def _blocked(reason: str) -> dict[str, Any]:
    return {"group_size": 1, "frontier": 0, "skip": 0, "blocker": reason, "held": []}


def _in_process_picture(runner: InProcessRunner, epoch: int) -> dict[str, Any]:
    pipeline = runner.pipeline
    try:
        point, group = runner.sharding_point()  # one rank too: its point counts positions
    except StateError:
        point, group = None, 1
    if not isinstance(point, ShardingFilter):
        return _blocked(_no_sharding_filter(point))
    if point.rest is not None:
        return _blocked(_IN_REST)
    blocker, held = _after_the_point(pipeline, point, epoch)
    # A group read in part with everything after the sharding point at rest: the
    # source ended inside it (the blocks that make whole groups emit only then).
    position = point.position
    return {
        "group_size": group,
        "frontier": -(-position // group),
        "skip": 0,
        "blocker": blocker,
        "held": held,
        "held_in": "pipeline",
    }


def _no_sharding_filter(point: Any) -> str:
    where = "the pipeline has no sharding_filter()"
    if point is not None:  # e.g. SequenceWrapper(...).to_iter(), which splits by its index
        where = f"the pipeline's sharding point is {point!r}, not a sharding_filter()"
    return (
        f"{where} (its position is where the ranks' frontiers are); resume it on the same "
        f"number of ranks"
    )


def _classic_picture(runner: ClassicRunner, epoch: int) -> dict[str, Any]:
    point = runner.plan.sharding_point
    if not isinstance(point, ShardingFilter):  # the new ranks could not start at the rest
        return _blocked(_no_sharding_filter(point))
    merge = runner.merge
    if not isinstance(merge, WorkerMerge):  # the planner assembles batches only without ranks
        return _blocked("workers building whole batches do not describe a rank's frontier")
    if merge.rest is not None:
        return _blocked(_IN_REST)
    blocker, held = _after_the_point(runner.main.pipeline, merge, epoch)
    state = merge.state_dict()
    return {
        "group_size": merge.group_size,
        "frontier": state["position"] // merge.group_size,
        "skip": state["delivered_here"],
        "blocker": blocker,
        "held": held,
        "held_in": "tail",
    }


_IN_REST = (
    "this checkpoint was taken in the rest of an epoch that was itself resumed on another "
    "number of ranks; it resumes on the same number of ranks, and from the next epoch on any "
    "number"
)


def _depends_on(block: Any, point: Any) -> bool:
    return any(b is point for b in upstream(block))


def _after_the_point(output: IterDataPipe, start: Any, epoch: int) -> tuple[str | None, list[int]]:
    """The blocks after ``start`` whose state differs from their state at the epoch's start.

    Returns the reason the picture is inexact (the first such block that does
    not declare ``HoldsItems``), or None, and the indices (in ``upstream(output)``)
    of those that hold items. The reference is a copy of the blocks after
    ``start`` (not of what feeds it: a large source is not copied), restarted
    for ``epoch``.
    """
    stand_in = IterableWrapper([])
    fresh = copy(output, replace={start: stand_in})
    set_pipeline_epoch(fresh, epoch)
    reset_pipeline(fresh)
    live = [b for b in upstream(output) if b is not start and _depends_on(b, start)]
    reference = [b for b in upstream(fresh) if b is not stand_in and _depends_on(b, stand_in)]
    if [type(b) for b in live] != [type(b) for b in reference]:
        return "the blocks after the sharding point could not be compared with a fresh copy", []
    index = {id(b): i for i, b in enumerate(upstream(output))}
    held: list[int] = []
    for block, initial in zip(live, reference):
        try:
            same = bool(block.state_dict() == initial.state_dict())
        except (RuntimeError, ValueError, TypeError):  # e.g. tensors compared element-wise
            same = False
        if same:
            continue
        if isinstance(block, HoldsItems):
            held.append(index[id(block)])
            continue
        why = getattr(block, "elastic_refusal", None)  # a block that knows why it cannot
        if isinstance(why, str):
            return f"{block!r} comes after the sharding point and {why}; {_WORKAROUND}", held
        return (
            f"{block!r} comes after the sharding point and is not at rest (its state differs "
            f"from an epoch's start) without declaring the items it holds (HoldsItems), so "
            f"they have no place in the positions the new ranks split; {_WORKAROUND}"
        ), held
    return None, held


def merge_rank_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """Join every rank's ``loader.state_dict()`` (taken at the same step) into one job state.

    Load the result into every rank's loader (``loader.load_state_dict``), on
    any number of ranks: on the same number each rank takes its own part
    back; on another, the positions no rank delivered are split among the new
    ranks, each delivered exactly once. States saved between epochs give the
    next epoch's start; states saved right after loading a job state (before
    the next item) give that job state.

    Raises:
        StateError: the states are not one of each rank of a
            ``DistributedReadingService`` job, or were taken at different steps.
    """
    if not isinstance(states, (list, tuple)) or not states:
        raise StateError(
            f"expected a list of every rank's loader.state_dict(), got {type(states).__name__}"
        )
    services = [s.get("service") if isinstance(s, dict) else None for s in states]
    if all(isinstance(s, dict) and "service" in s and s["service"] is None for s in states):
        # every rank saved between two epochs: the next epoch's start, on any number of ranks
        return _the_same_state(
            states, "were saved between epochs", "save every rank's state_dict() at the same step"
        )
    if all(isinstance(s, dict) and s.get("kind") == "distributed-job" for s in services):
        # every rank loaded one job state and saved before its next item: that state again
        return _the_same_state(
            states, "are joined job states", "every rank must load the same job state"
        )
    if not all(isinstance(s, dict) and s.get("kind") == "distributed" for s in services):
        raise StateError(
            "merge_rank_states() joins states of loaders with a DistributedReadingService, "
            "taken while an epoch runs; some state is not one"
        )
    world = len(states)
    by_rank = sorted(services, key=lambda s: s.get("rank", -1))  # type: ignore[union-attr]
    found = [(s.get("rank"), s.get("world_size")) for s in by_rank]  # type: ignore[union-attr]
    if found != [(rank, world) for rank in range(world)]:
        raise StateError(
            f"expected one state from each of ranks 0 .. {world - 1} of a job of {world} "
            f"ranks, got (rank, world size) {found}; gather every rank's state_dict()"
        )
    steps = {(s["epoch"], s["delivered"]) for s in states}
    if len(steps) > 1:
        raise StateError(
            f"the ranks' states were taken at different steps ((epoch, delivered): "
            f"{sorted(steps)}); save every rank's state_dict() at the same step"
        )
    first = states[0]
    return {**first, "service": {"kind": "distributed-job", "world_size": world, "ranks": by_rank}}


def _the_same_state(states: list[dict[str, Any]], saved: str, fix: str) -> dict[str, Any]:
    """The one state every rank ``saved`` (e.g. between two epochs), or a ``StateError``."""
    steps = {(s.get("epoch"), s.get("delivered"), s.get("seed")) for s in states}
    if len(steps) > 1:
        raise StateError(
            f"the ranks' states {saved} but disagree on (epoch, delivered, seed): "
            f"{sorted(steps, key=repr)}; {fix}"
        )
    return dict(states[0])


def rest_of_epoch(ranks: list[dict[str, Any]]) -> RestOfEpoch:
    """The positions no old rank delivered (``ranks``: their service states, by rank).

    Raises:
        StateError: a rank's picture is not exact (the message names the block).
    """
    pictures: list[dict[str, Any]] = []
    for rank, state in enumerate(ranks):
        picture = state.get("elastic")
        if not isinstance(picture, dict):
            raise StateError(
                f"rank {rank}'s state has no picture of its progress (saved outside an epoch "
                f"or by an older pipeloom); resume on {len(ranks)} ranks"
            )
        if state.get("padding"):  # repeating its shard (uneven="pad"): all of it delivered
            pictures.append({"group_size": None, "frontier": _WHOLE_SHARD, "skip": 0})
            continue
        if picture.get("blocker") is not None:
            raise StateError(
                f"cannot resume rank {rank}'s part of the epoch on another number of ranks "
                f"exactly: {picture['blocker']}"
            )
        pictures.append(picture)
    groups = {p["group_size"] for p in pictures} - {None}  # (held items: held_states())
    if len(groups) > 1:
        raise StateError(f"the ranks' states disagree on the sharding group size: {groups}")
    return RestOfEpoch(
        group_size=groups.pop() if groups else 1,
        old_total=len(ranks),
        frontiers=tuple(int(p["frontier"]) for p in pictures),
        skips=tuple(int(p["skip"]) for p in pictures),
    )


def held_states(
    ranks: list[dict[str, Any]], total: int, index: int, uneven: str = "shortest"
) -> dict[str, Any]:
    """The held items of new rank ``index`` of ``total``: every old rank's, to share out.

    Returns ``{"index", "total", "uneven", "blocks": {block index: [its state on
    each old rank that held items there, by rank]}, "types": {block index: its
    type's name}}``; the blocks keep their share
    (``pipeloom.datapipes.runtime.load_held``).
    """
    blocks_held: dict[int, list[dict]] = {}
    types: dict[int, str] = {}
    held = {"index": index, "total": total, "uneven": uneven, "blocks": blocks_held}
    held["types"] = types
    for rank, state in enumerate(ranks):
        picture = state.get("elastic") or {}
        if not picture.get("held") or state.get("padding"):
            continue
        inner = state.get("inner") or {}
        blocks = (inner.get(picture.get("held_in")) or {}).get("blocks")
        if not isinstance(blocks, list):
            raise StateError(
                f"rank {rank}'s state says blocks hold items but carries no state of them; "
                f"resume on {len(ranks)} ranks"
            )
        for block in picture["held"]:
            blocks_held.setdefault(int(block), []).append(blocks[block]["state"])
            types[int(block)] = str(blocks[block].get("type"))
    return held
