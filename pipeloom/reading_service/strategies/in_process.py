"""Everything in the calling thread: the reference every other strategy must match."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...datapipes import (
    IterDataPipe,
    load_pipeline_state_dict,
    pipeline_state_dict,
    reset_pipeline,
    set_pipeline_epoch,
)
from ...datapipes.runtime import RestOfEpoch, end_iteration, iteration_marks, load_held
from ...errors import StateError, StateOfAnotherService
from ...graph import Plan
from ..planning.cut import PlanError, cut_for_workers
from ..planning.sharding import keep_shard
from .runner import Runner, drain

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
        if plan.outer != (1, 0):
            assert plan.sharding_point is not None
            keep_shard(plan.sharding_point, group_size=plan.group_size, outer=plan.outer)

    def start_epoch(self, epoch: int, state: dict[str, Any] | None) -> Iterator[Any]:
        pipeline = self.pipeline
        set_pipeline_epoch(pipeline, epoch)
        reset_pipeline(pipeline)
        rest = state.get("rest") if state is not None else None
        if isinstance(rest, RestOfEpoch):  # resumed on another number of ranks
            point, group_size = self.sharding_point()
            point.set_shard_group_size(group_size)  # one rank: the groups the old ranks had
            point.resume_at(rest)
            load_held(pipeline, state.get("held") if state else None)  # the old ranks held them
        elif state is not None:
            if state.get("kind") != "in-process":
                raise StateOfAnotherService(
                    f"this state was saved by a {state.get('kind', 'different')} reading "
                    f"service; the in-process service resumes only in-process states"
                )
            load_pipeline_state_dict(pipeline, state.get("pipeline", {}))
        self._marks = iteration_marks(pipeline)
        return drain(pipeline)

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
        return {"kind": "in-process", "pipeline": pipeline_state_dict(self.pipeline)}
