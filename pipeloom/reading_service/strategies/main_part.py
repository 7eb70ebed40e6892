"""What the main process runs beside its workers: the tail, and the separate processes.

When workers run a part of the pipeline, the main process runs a copy of the
rest: a *stand-in* block (the classic merge, the economic/chunked dispatcher)
takes the place of the workers' exit, and a :class:`SeparateProcessReader`
takes the place of each block marked to run in a process of its own. Its
checkpoint is the state of that copy, stand-in included.
"""

from __future__ import annotations

from typing import Any

from ..._shutdown import Steps
from ...datapipes import (
    DataPipe,
    IterDataPipe,
    load_pipeline_state_dict,
    pipeline_state_dict,
    reset_pipeline,
    set_pipeline_epoch,
)
from ...errors import StateOfAnotherService
from ...graph import Plan, copy, upstream
from ..workers.separate_process import SeparateProcessReader

__all__ = ["MainPart"]


class MainPart:
    """The main process's copy of the pipeline, ``stand_in`` in place of ``exit``.

    Args:
        pipeline: the whole pipeline (left as it is).
        plan: its plan (the separate-process parts are read from it).
        stand_in: the block the main process reads the workers through.
        exit: the block of ``pipeline`` the workers' output comes from.
        start_method, prefetch: for the separate processes.
    """

    def __init__(
        self,
        pipeline: IterDataPipe,
        plan: Plan,
        stand_in: IterDataPipe,
        exit: DataPipe,
        *,
        start_method: str | None,
        prefetch: int,
    ) -> None:
        readers: dict[DataPipe, SeparateProcessReader] = {}
        for part in plan.parts:
            if part.role == "separate process":
                assert isinstance(part.exit, IterDataPipe)
                readers[part.exit] = SeparateProcessReader(
                    part.exit, start_method=start_method, prefetch=prefetch
                )
        self.stand_in = stand_in
        self.readers = list(readers.values())
        self.pipeline: IterDataPipe = copy(pipeline, replace={exit: stand_in, **readers})

    def start_epoch(self, epoch: int, state: dict[str, Any] | None) -> None:
        """Restart the copy for ``epoch``, restoring ``state`` (a :meth:`state_dict`)."""
        if state is not None:
            self.check_kind(state)
        set_pipeline_epoch(self.pipeline, epoch)
        reset_pipeline(self.pipeline)
        if state is not None:
            load_pipeline_state_dict(self.pipeline, state.get("tail", {}))

    def check_kind(self, state: Any) -> None:
        """Raise ``StateOfAnotherService`` unless ``state`` is of this main part's shape."""
        kind = state.get("kind") if isinstance(state, dict) else None
        if kind != "workers":
            raise StateOfAnotherService(
                f"this state was saved by a {kind or 'different'} reading service; a thread "
                f"or process service resumes directly only a state saved by a thread or "
                f"process service (with num_workers > 0)"
            )
        tail = state.get("tail")
        saved = tail.get("blocks") if isinstance(tail, dict) else None
        if isinstance(saved, (list, tuple)) and all(isinstance(e, dict) for e in saved):
            types = [entry.get("type") for entry in saved]
            own = [type(block).__qualname__ for block in upstream(self.pipeline)]
            if types != own:
                raise StateOfAnotherService(
                    f"this state was saved where the main process read the workers' output "
                    f"through {types}, but this service reads it through {own} (another "
                    f"strategy)"
                )

    def start_separate_processes(self, epoch: int) -> None:
        for reader in self.readers:
            reader.start(epoch)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "workers", "tail": pipeline_state_dict(self.pipeline)}

    def stop(self) -> None:
        with Steps() as steps:
            for reader in self.readers:
                steps.run(reader.stop)

    def queues(self) -> list[tuple[str, Any]]:
        """Each separate process's queue to the main process."""
        return [q for reader in self.readers for q in reader.queues()]
