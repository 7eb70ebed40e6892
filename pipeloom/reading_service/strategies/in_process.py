"""Everything in the calling thread: the reference every other strategy must match."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

from ...datapipes import (
    IterDataPipe,
    load_pipeline_state_dict,
    pipeline_state_dict,
    reset_pipeline,
    set_pipeline_epoch,
)
from ...datapipes.runtime import (
    RestOfEpoch,
    current_stamp,
    end_iteration,
    iteration_marks,
    key_position,
    load_held,
    restore_stamp,
)
from ...errors import StateError, StateOfAnotherService
from ...graph import Plan
from ..planning.cut import PlanError, cut_for_workers
from ..planning.sharding import keep_shard
from .runner import Runner, close_items, drain, primed

__all__ = ["InProcessRunner"]


class InProcessRunner(Runner):
    """Run the whole pipeline in the thread that iterates the loader.

    Under outer sharding (a rank's share) the pipeline's own sharding point
    keeps this process's shard, cut as the worker strategies cut it.
    """

    def __init__(self, pipeline: IterDataPipe, plan: Plan) -> None:
        super().__init__(pipeline, plan)
        self._unplanned_point: tuple[Any, int] | None = None  # found by sharding_point()
        self._marks: list[tuple[IterDataPipe, int]] = []  # the last epoch's (see shutdown)
        self._skipper: _DeliveredOutputs | None = None  # in the rest of an elastic resume
        if plan.outer != (1, 0):
            assert plan.sharding_point is not None
            keep_shard(plan.sharding_point, group_size=plan.group_size, outer=plan.outer)

    def start_epoch(self, epoch: int, state: dict[str, Any] | None) -> Iterator[Any]:
        pipeline = self.pipeline
        set_pipeline_epoch(pipeline, epoch)
        reset_pipeline(pipeline)
        self._skipper = None
        rest = state.get("rest") if state is not None else None
        if isinstance(rest, RestOfEpoch):  # resumed on another number of ranks
            point, group_size = self.sharding_point()
            point.set_shard_group_size(group_size)  # one rank: the groups the old ranks had
            point.resume_at(rest)
            load_held(pipeline, state.get("held") if state else None)  # the old ranks held them
            self._skipper = _DeliveredOutputs(rest, group_size, [])
        elif state is not None:
            if state.get("kind") != "in-process":
                raise StateOfAnotherService(
                    f"this state was saved by a {state.get('kind', 'different')} reading "
                    f"service; the in-process service resumes only in-process states"
                )
            load_pipeline_state_dict(pipeline, state.get("pipeline", {}))
            if "rest_skipped" in state:  # a checkpoint in such a rest, resumed on this rank
                point, group_size = self.sharding_point()
                if isinstance(point.rest, RestOfEpoch):
                    self._skipper = _DeliveredOutputs(point.rest, group_size, state["rest_skipped"])
        self._marks = iteration_marks(pipeline)
        items = drain(pipeline)
        return _own_stamps(items if self._skipper is None else self._skipper.filter(items), epoch)

    def shutdown(self) -> None:
        """Restart the blocks still in the last epoch: a stream it left open closes now.

        Not at the next epoch, nor when the garbage collector frees the pipeline
        (a block's generator keeps it in a reference cycle): a loader built per
        epoch and shut down (or dropped) mid-epoch would hold a file each.
        """
        marks, self._marks = self._marks, []
        end_iteration(marks)

    def sharding_point(self) -> tuple[Any, int]:
        """The sharding point and its group size, also for one rank (a plan without outer
        sharding has none: the point counts positions, so a rank of one has a frontier)."""
        if self.plan.sharding_point is not None:
            return self.plan.sharding_point, self.plan.group_size
        if self._unplanned_point is None:
            try:
                cut = cut_for_workers(self.pipeline, refuse_separate=False)
            except PlanError as error:
                raise StateError(
                    f"the rest of an epoch resumes at the pipeline's sharding point, but {error}"
                ) from error
            self._unplanned_point = (cut.sharding_point, cut.group_size)
        return self._unplanned_point

    def state_dict(self) -> dict[str, Any]:
        state = {"kind": "in-process", "pipeline": pipeline_state_dict(self.pipeline)}
        if self._skipper is not None:
            state["rest_skipped"] = self._skipper.state()
        return state


def _own_stamps(items: Iterator[Any], epoch: int) -> Iterator[Any]:
    """``items``, each made from a clean item stamp, as a worker starts its epoch.

    The stamp is per thread, and this thread may have made items of another loader
    (or of this one, before a restart of the epoch) since: a source that does not key
    its items would take that item's draws as its own when it is at the same place
    and position, and ``item_rng()`` would draw other numbers than under workers.
    Closing it closes ``items``, also before its first item (as ``drain``'s).
    """
    return primed(_restamped(items, epoch))


def _restamped(items: Iterator[Any], epoch: int) -> Generator[Any, None, None]:
    try:
        yield None  # taken by _own_stamps()
        while True:
            restore_stamp((None, epoch, None))
            try:
                item = next(items)
            except StopIteration:
                return
            yield item
    finally:
        close_items(items)


class _DeliveredOutputs:
    """The outputs the old ranks delivered of a group they had begun (the ``skip`` of a
    :class:`RestOfEpoch`): the sharding point restarts at the group's first position, so
    its first outputs come again and are dropped here, as the worker merge drops them."""

    def __init__(self, rest: RestOfEpoch, group_size: int, skipped: list) -> None:
        self.rest, self.group_size = rest, group_size
        self.skipped = {int(group): int(count) for group, count in skipped}

    def state(self) -> list[list[int]]:
        return [[group, count] for group, count in sorted(self.skipped.items())]

    def filter(self, items: Iterator[Any]) -> Iterator[Any]:
        for item in items:
            if not self._delivered_before():
                yield item

    def _delivered_before(self) -> bool:
        position = key_position(current_stamp()[2])  # of the output just made
        virtual = None if position is None else self.rest.virtual(position)
        if virtual is None:
            return False
        group = virtual // self.group_size
        done = self.skipped.get(group, 0)
        if done >= self.rest.skip(group):
            return False
        self.skipped[group] = done + 1
        return True
