"""The main-process side shared by the thread and process services.

``split_for_workers`` cuts a pipeline (see ``_plan``) and builds the part the
main process runs: a copy of the blocks after the workers, reading a
:class:`WorkerMerge` in place of the workers' exit. ``start_main_epoch``
restarts that part for an epoch and, when resuming, tells where the workers
must start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..datapipes import IterDataPipe, reset_pipeline, set_pipeline_epoch
from ..graph import copy as copy_pipeline
from ._merge import WorkerMerge, load_tail_state
from ._plan import WorkerPlan, plan_workers
from ._separate import SeparateProcessReader, split_separate_processes
from ._worker_loop import apply_sharding

__all__ = ["MainPart", "split_for_workers", "start_main_epoch"]


@dataclass
class MainPart:
    """What the main process runs: ``pipeline`` reads the workers through ``merge``."""

    plan: WorkerPlan
    merge: WorkerMerge
    pipeline: IterDataPipe
    separate: list[SeparateProcessReader]


def split_for_workers(
    pipeline: IterDataPipe,
    *,
    in_order: bool,
    start_method: str | None,
    prefetch: int,
    outer: tuple[int, int] = (1, 0),
) -> MainPart:
    """Plan ``pipeline`` and build the main part; ``outer``: this process's shard (a rank's).

    Under outer sharding the roots of ``pipeline`` itself keep the outer shard
    too, so ``len(pipeline)`` counts this process's items; workers refine it.
    """
    plan = plan_workers(pipeline)
    merge = WorkerMerge(
        group_size=plan.group_size,
        in_order=in_order,
        single_output=plan.single_output,
        outer=outer,
    )
    if outer != (1, 0):
        apply_sharding(plan.exit, plan.root_indices, 1, 0, plan.group_size, outer)
    main = merge if plan.exit is pipeline else copy_pipeline(pipeline, replace={plan.exit: merge})
    main, separate = split_separate_processes(
        main, start_method=start_method, prefetch=prefetch, forbidden=merge
    )
    return MainPart(plan, merge, main, separate)


def start_main_epoch(
    part: MainPart, epoch: int, state: dict[str, Any] | None
) -> tuple[tuple[int, ...], int] | None:
    """Reset the main part for ``epoch`` (restoring ``state``); the workers' resume point."""
    set_pipeline_epoch(part.pipeline, epoch)
    reset_pipeline(part.pipeline)
    if state is None:
        return None
    load_tail_state(part.pipeline, state)
    return part.plan.root_indices, part.merge.resume_position
