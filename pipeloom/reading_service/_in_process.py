"""Everything in the calling thread: the default, and the reference for determinism."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ..datapipes import (
    BlockingReader,
    IterDataPipe,
    load_pipeline_state_dict,
    pipeline_state_dict,
    reset_pipeline,
    set_pipeline_epoch,
)
from ..errors import StateError
from ..graph import Placement
from ._base import ReadingService
from ._plan import plan_workers
from ._worker_loop import apply_sharding

__all__ = ["InProcessReadingService"]


class InProcessReadingService(ReadingService):
    """Run the whole pipeline in the thread that iterates the loader.

    Best for debugging (breakpoints and tracebacks are plain) and for
    pipelines whose work is already cheap.

    Example:
        >>> from pipeloom import DataLoader
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(DataLoader(IterableWrapper(range(3)), InProcessReadingService()))
        [0, 1, 2]
    """

    def __init__(self) -> None:
        self._pipeline: IterDataPipe | None = None
        self._outer = (1, 0)

    def set_outer_sharding(self, total: int, index: int) -> None:
        self._outer = (total, index)

    def initialize(self, pipeline: IterDataPipe) -> None:
        if not isinstance(pipeline, IterDataPipe):
            raise TypeError(f"expected an IterDataPipe, got {type(pipeline).__name__}")
        if self._outer != (1, 0):  # keep one shard, in place: this thread runs the pipeline
            # Cut as the worker services do (runs of batch_size positions when batches
            # would be built in workers), so a rank's items do not depend on its service.
            plan = plan_workers(pipeline, refuse_separate=False)  # the marks are ignored here
            apply_sharding(plan.exit, plan.root_indices, 1, 0, plan.group_size, self._outer)
        self._pipeline = pipeline

    def start_epoch(self, epoch: int, state: dict[str, Any] | None = None) -> Iterator[Any]:
        pipeline = self._require_pipeline()
        set_pipeline_epoch(pipeline, epoch)
        reset_pipeline(pipeline)
        if state is not None:
            if state.get("kind") != "in-process":
                raise StateError(
                    f"this state was saved by a {state.get('kind', 'different')} reading "
                    f"service; the in-process service resumes only in-process states"
                )
            load_pipeline_state_dict(pipeline, state.get("pipeline", {}))
        return drain(pipeline)

    def placement(self) -> Placement:
        return Placement.uniform(self._require_pipeline(), "main thread")

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "in-process", "pipeline": pipeline_state_dict(self._require_pipeline())}

    def _require_pipeline(self) -> IterDataPipe:
        if self._pipeline is None:
            raise RuntimeError("InProcessReadingService used before initialize(pipeline)")
        return self._pipeline

    def __repr__(self) -> str:
        return "InProcessReadingService()"


def drain(
    pipeline: IterDataPipe,
    on_close: Callable[[bool], None] | None = None,
    timeout: float | None = None,
) -> Iterator[Any]:
    """Yield a pipeline's items, waiting on its readiness events.

    ``on_close(finished)`` runs when the generator ends: ``finished`` is True
    after the last item, False when the consumer stopped early or it raised.
    """
    reader = BlockingReader(pipeline)
    finished = False
    try:
        while True:
            try:
                item = reader.next(timeout)
            except StopIteration:
                finished = True
                return
            except TimeoutError:
                raise TimeoutError(
                    f"no item arrived within timeout={timeout} s; raise the timeout or "
                    f"check for a stuck worker"
                ) from None
            yield item
    finally:
        reader.close()
        if on_close is not None:
            on_close(finished)
