"""Contract checks every block should pass; used by pipeloom's own tests.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> check_resume_from_every_step(lambda: IterableWrapper(range(5)).batch(2))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .datapipes import (
    BlockingReader,
    DataPipe,
    IterDataPipe,
    load_pipeline_state_dict,
    pipeline_state_dict,
    reset_pipeline,
    seed_pipeline,
    set_pipeline_epoch,
)

__all__ = ["check_resume_from_every_step", "collect", "collect_async"]


def collect(pipe: IterDataPipe, *, seed: int | None = 0, epoch: int = 0) -> list[Any]:
    """All items of one epoch, iterated synchronously."""
    seed_pipeline(pipe, seed)
    set_pipeline_epoch(pipe, epoch)
    return list(pipe)


def collect_async(pipe: IterDataPipe, *, seed: int | None = 0, epoch: int = 0) -> list[Any]:
    """All items of one epoch, read through ``async_next`` and readiness events."""
    seed_pipeline(pipe, seed)
    set_pipeline_epoch(pipe, epoch)
    reset_pipeline(pipe)
    return _drain(BlockingReader(pipe))


def _drain(reader: BlockingReader, limit: int | None = None) -> list[Any]:
    items: list[Any] = []
    while limit is None or len(items) < limit:
        try:
            items.append(reader.next(timeout=30))
        except StopIteration:
            break
    return items


def check_resume_from_every_step(
    make_pipe: Callable[[], DataPipe],
    *,
    seed: int = 0,
    epoch: int = 0,
    steps: list[int] | None = None,
) -> None:
    """Save the state after each step, restore it into a fresh pipeline, compare.

    For every ``k`` (or each of ``steps``): the first ``k`` items of an epoch,
    then the items of a freshly built pipeline restored from the state saved
    at ``k``, must equal the uninterrupted epoch.

    Raises:
        AssertionError: naming the step where the resumed stream differs.
    """
    expected = collect_async(_as_iter(make_pipe()), seed=seed, epoch=epoch)
    for step in range(len(expected) + 1) if steps is None else steps:
        pipe = make_pipe()
        seed_pipeline(pipe, seed)
        set_pipeline_epoch(pipe, epoch)
        reset_pipeline(pipe)
        head = _drain(BlockingReader(pipe), limit=step)
        state = pipeline_state_dict(pipe)
        resumed = make_pipe()
        seed_pipeline(resumed, seed)
        set_pipeline_epoch(resumed, epoch)
        reset_pipeline(resumed)
        load_pipeline_state_dict(resumed, state)
        tail = _drain(BlockingReader(resumed))
        if head + tail != expected:
            raise AssertionError(
                f"resuming after {step} items differs from the uninterrupted epoch:\n"
                f"  expected {expected!r}\n  got      {head + tail!r}"
            )


def _as_iter(pipe: DataPipe) -> IterDataPipe:
    if not isinstance(pipe, IterDataPipe):
        raise TypeError(f"expected a factory of IterDataPipe, got {type(pipe).__name__}")
    return pipe
