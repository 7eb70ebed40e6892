"""Carry a worker's exception to the main process with its origin."""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from ...datapipes import DataPipe, current_position
from ...errors import WorkerError

__all__ = ["Failure", "capture_failure"]


@dataclass(frozen=True)
class Failure:
    """A picklable record of an exception raised in a worker."""

    worker: str
    type_name: str
    message: str
    traceback_text: str
    block: str | None
    item: int | None
    exc_class: type | None

    def raise_here(self) -> None:
        """Raise the original exception type in this process, its origin attached.

        The raised exception's message names the worker, block and item and
        includes the worker's traceback; its ``__cause__`` is a
        :class:`~pipeloom.errors.WorkerError` with the same facts as attributes.
        """
        origin = [self.worker]
        if self.block:
            origin.append(f"block {self.block}")
        if self.item is not None:
            origin.append(f"item at position {self.item}")
        text = (
            f"{self.type_name}: {self.message}\n"
            f"  raised in {', '.join(origin)}\n"
            f"Original traceback:\n{self.traceback_text.rstrip()}"
        )
        error = WorkerError(
            text,
            worker=self.worker,
            block=self.block,
            item=self.item,
            original_type=self.type_name,
            traceback_text=self.traceback_text,
        )
        rebuilt: BaseException | None = None
        if self.exc_class is not None and issubclass(self.exc_class, Exception):
            try:
                rebuilt = self.exc_class(text)
            except Exception:
                rebuilt = None
        if rebuilt is None:
            raise error
        raise rebuilt from error


def capture_failure(error: BaseException, worker: str) -> Failure:
    """Record ``error`` (raised while producing an item in ``worker``)."""
    exc_class: type | None = type(error)
    if type(error).__module__ == "__main__" or "<locals>" in type(error).__qualname__:
        exc_class = None  # not importable by the receiving process
    return Failure(
        worker=worker,
        type_name=type(error).__qualname__,
        message=str(error),
        traceback_text="".join(traceback.format_exception(error)),
        block=_failing_block(error),
        item=current_position(),
        exc_class=exc_class,
    )


def _failing_block(error: BaseException) -> str | None:
    """``repr`` of the innermost block on the traceback (the one that raised)."""
    found = None
    tb = error.__traceback__
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("self")
        if isinstance(candidate, DataPipe):
            found = candidate
        tb = tb.tb_next
    try:
        return repr(found) if found is not None else None
    except Exception:
        return type(found).__name__
