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
from ...datapipes.runtime import RestOfEpoch, load_held
from ...errors import StateOfAnotherService
from ...graph import Plan
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
        if plan.outer != (1, 0):
            assert plan.sharding_point is not None
            keep_shard(plan.sharding_point, group_size=plan.group_size, outer=plan.outer)

    def start_epoch(self, epoch: int, state: dict[str, Any] | None) -> Iterator[Any]:
        pipeline = self.pipeline
        set_pipeline_epoch(pipeline, epoch)
        reset_pipeline(pipeline)
        rest = state.get("rest") if state is not None else None
        if isinstance(rest, RestOfEpoch):  # resumed on another number of ranks
            assert self.plan.sharding_point is not None
            self.plan.sharding_point.resume_at(rest)  # type: ignore[arg-type]
            load_held(pipeline, state.get("held") if state else None)  # the old ranks held them
        elif state is not None:
            if state.get("kind") != "in-process":
                raise StateOfAnotherService(
                    f"this state was saved by a {state.get('kind', 'different')} reading "
                    f"service; the in-process service resumes only in-process states"
                )
            load_pipeline_state_dict(pipeline, state.get("pipeline", {}))
        return drain(pipeline)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "in-process", "pipeline": pipeline_state_dict(self.pipeline)}
