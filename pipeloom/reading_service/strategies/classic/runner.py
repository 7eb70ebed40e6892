"""The classic strategy's epochs: replicas in workers, the tail after an ordered merge.

Each worker runs a copy of the workers' part (everything up to the sharding
point, which keeps the worker's shard, and the per-item blocks after it) and
sends its outputs through its own queue; the main process runs the rest of
the pipeline on a :class:`~.merge.WorkerMerge` of them. The workers are
threads (``thread_pool.py``) or processes (``process_pool.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol, cast

from ...._shutdown import Steps
from ....datapipes import IterDataPipe
from ....datapipes.runtime import RestOfEpoch, block_seed, derive_seed, load_held
from ....errors import StateError, StateOfAnotherService
from ....graph import Plan
from ...planning.cut import assembles_batches, single_output
from ...planning.sharding import keep_shard
from ..main_part import MainPart
from ..runner import Runner, drain
from .batch_merge import BatchMerge
from .merge import WorkerChannel, WorkerMerge
from .translate import fresh_states, translated

__all__ = ["ClassicRunner", "WorkerPool"]


class WorkerPool(Protocol):
    """The classic workers, threads or processes."""

    def start_epoch(self, epoch: int, resume: int | RestOfEpoch | None) -> Sequence[WorkerChannel]:
        """Start producing ``epoch`` (from position ``resume``, or the rest of the epoch
        resumed on another number of ranks); one channel per worker."""

    def finish_epoch(self, *, abandoned: bool) -> None:
        """The epoch is over (``abandoned``: before the workers finished it)."""

    def stop(self) -> None:
        """Stop every worker; idempotent."""

    def queues(self) -> Sequence[tuple[str, Any]]:
        """The workers' queues while they run, labelled."""


class AssemblingPool(WorkerPool, Protocol):
    """Worker processes that build assembled batches (``assemble.py``)."""

    def start_epoch(
        self, epoch: int, resume: int | RestOfEpoch | None, skip: int = 0
    ) -> Sequence[WorkerChannel]:
        """As ``WorkerPool.start_epoch``, dropping the first ``skip`` outputs at ``resume``."""


class ClassicRunner(Runner):
    """Run a classic plan with ``pool``'s workers.

    Args:
        pipeline, plan: the pipeline and its plan (strategy ``"threads"`` or ``"classic"``).
        pool: the workers, built from the plan's ``"workers"`` part.
        in_order: merge by source position (True) or by arrival (False).
        timeout: seconds to wait for the next output (None: as long as the workers live).
        start_method, prefetch: for separate processes.
    """

    def __init__(
        self,
        pipeline: IterDataPipe,
        plan: Plan,
        pool: WorkerPool,
        *,
        in_order: bool,
        timeout: float | None,
        start_method: str | None,
        prefetch: int,
    ) -> None:
        super().__init__(pipeline, plan)
        workers = plan.part("workers")
        point = plan.sharding_point
        assert point is not None and workers.exit is not None
        if plan.outer != (1, 0):  # so that len(pipeline) counts this process's items
            keep_shard(point, group_size=plan.group_size, outer=plan.outer)
        self.merge: WorkerMerge | BatchMerge
        if assembles_batches(workers.exit, point):
            self.merge = BatchMerge(run_size=plan.group_size)
        else:
            self.merge = WorkerMerge(
                group_size=plan.group_size,
                in_order=in_order,
                single_output=single_output(workers.exit, point, plan.group_size),
                outer=plan.outer,
            )
        self.main = MainPart(
            pipeline, plan, self.merge, workers.exit, start_method=start_method, prefetch=prefetch
        )
        self.pool = pool
        self.timeout = timeout
        self._point_seed = block_seed(point)
        self._point, self._group = point, plan.group_size
        self._epoch_open = False
        self._fresh: list[dict[str, Any]] | None = None  # see _fresh_states

    def start_epoch(self, epoch: int, state: dict[str, Any] | None) -> Iterator[Any]:
        self._finish_epoch(abandoned=True)  # an epoch still open is abandoned
        rest = state.get("rest") if state is not None else None
        if state is not None and rest is None:  # saved with batches built on the other side
            state = translated(state, self._fresh_states, self.main.pipeline, self._group)
        if isinstance(rest, RestOfEpoch):  # resumed on another number of ranks
            if not isinstance(self.merge, WorkerMerge):
                raise StateError(
                    "this state is the rest of an epoch saved on another number of ranks; "
                    "load it into a loader whose service is DistributedReadingService "
                    "(alone or followed by threads or processes)"
                )
            self.main.start_epoch(epoch, None)
            load_held(self.main.pipeline, state.get("held") if state else None)
            self.merge.resume_rest(rest)
            self._epoch_open = True  # before: Ctrl-C must not hide a started epoch
            channels = self.pool.start_epoch(epoch, rest)
        elif isinstance(self.merge, BatchMerge) and state is not None:
            self.main.start_epoch(epoch, state)
            pool = cast(AssemblingPool, self.pool)  # planned for worker processes only
            self._epoch_open = True  # before: Ctrl-C must not hide a started epoch
            channels = pool.start_epoch(epoch, self.merge.resume_position, self.merge.resume_skip)
        else:
            self.main.start_epoch(epoch, state)
            resume = None
            if state is not None:
                resume = (
                    self.merge.resume_point()
                    if isinstance(self.merge, WorkerMerge)
                    else self.merge.resume_position
                )
            self._epoch_open = True  # before: Ctrl-C must not hide a started epoch
            channels = self.pool.start_epoch(epoch, resume)
        seed = None if self._point_seed is None else derive_seed(self._point_seed, epoch)
        self.merge.attach(channels, seed=seed, epoch=epoch)
        self.main.start_separate_processes(epoch)
        return drain(self.main.pipeline, on_close=self._on_epoch_closed, timeout=self.timeout)

    def state_dict(self) -> dict[str, Any]:
        return self.main.state_dict()

    def _fresh_states(self) -> list[dict[str, Any]]:
        """The blocks after the sharding point at an epoch's start (``translate.py``), once:
        a warm start may ask at every output until it can move."""
        if self._fresh is None:
            self._fresh = fresh_states(self.pipeline, self._point)
        return self._fresh

    def resumes_exactly(self, state: dict[str, Any]) -> bool:
        """Whether :meth:`start_epoch` resumes ``state`` (a thread or process service's) as
        it is or translated, rather than refusing it as another shape's: a translation is
        exact only where the blocks that change sides hold nothing (``translate.py``)."""
        if state.get("rest") is None:
            state = translated(state, self._fresh_states, self.main.pipeline, self._group)
        try:
            self.main.check_kind(state)
        except StateOfAnotherService:
            return False
        return True

    def shutdown(self) -> None:
        self._epoch_open = False
        with Steps() as steps:
            steps.run(self.pool.stop)
            steps.run(self.main.stop)

    def queues(self) -> Sequence[tuple[str, Any]]:
        return [*self.pool.queues(), *self.main.queues()]

    def _on_epoch_closed(self, finished: bool) -> None:
        # The tail may stop before the workers do (e.g. a header): then the
        # workers' epoch is abandoned too, and persistent workers must cancel it.
        self._finish_epoch(abandoned=not (finished and self.merge.exhausted))

    def _finish_epoch(self, *, abandoned: bool) -> None:
        if self._epoch_open:
            self._epoch_open = False
            self.pool.finish_epoch(abandoned=abandoned)
