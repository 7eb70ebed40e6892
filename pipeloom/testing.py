"""Contract checks every block should pass; used by pipeloom's own tests.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> check_resume_from_every_step(lambda: IterableWrapper(range(5)).batch(2))
    >>> check_same_output_everywhere(lambda: IterableWrapper(range(6)).sharding_filter().batch(2))
    ['in-process', 'threads', 'classic', 'economic', 'chunked']
"""

from __future__ import annotations

import functools
import pickle
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

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
from .datapipes import item_rng as _item_rng
from .loader import DataLoader
from .reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ReadingService,
    ThreadReadingService,
)
from .reading_service.planning.cut import PlanError

__all__ = [
    "check_resume_from_every_step",
    "check_same_output_everywhere",
    "collect",
    "collect_async",
]


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
    at ``k`` and read in a fresh thread (as a new process would), must equal
    the uninterrupted epoch, ``item_rng()`` draws included. The interrupted
    pipeline then reads on, as a training loop goes on after a checkpoint, and
    the saved state must not change: ``state_dict()`` returns copies.

    Raises:
        AssertionError: naming the step where the resumed stream differs.
    """
    expected = collect_async(_as_iter(make_pipe()), seed=seed, epoch=epoch)
    for step in range(len(expected) + 1) if steps is None else steps:
        pipe = make_pipe()
        seed_pipeline(pipe, seed)
        set_pipeline_epoch(pipe, epoch)
        reset_pipeline(pipe)
        reader = BlockingReader(pipe)
        head = _drain(reader, limit=step)
        state = pipeline_state_dict(pipe)
        _check_state_is_a_copy(state, reader, step)
        tail = _in_a_fresh_thread(functools.partial(_resume, make_pipe(), state, seed, epoch))
        if not _same(head + tail, expected):
            raise AssertionError(
                f"resuming after {step} items differs from the uninterrupted epoch:\n"
                f"  expected {expected!r}\n  got      {head + tail!r}"
            )


def _check_state_is_a_copy(state: dict, reader: BlockingReader, step: int) -> None:
    """Read the rest of the epoch, as a training loop goes on after its checkpoint: the
    state must not change (a block that returns its live list loses items on resume)."""
    try:
        saved = pickle.dumps(state)
    except Exception:  # noqa: BLE001 - an unpicklable state: the resume check still runs
        return
    _drain(reader)
    if pickle.dumps(state) != saved:
        raise AssertionError(
            f"the state saved after {step} items changed as the pipeline went on: a "
            f"block's state_dict() returned its own list or dict instead of a copy, so "
            f"a checkpoint taken before more items are read resumes at the wrong place; "
            f"return copies (list(self._items), dict(self._counts))"
        )


def _resume(pipe: DataPipe, state: dict, seed: int, epoch: int) -> list[Any]:
    seed_pipeline(pipe, seed)
    set_pipeline_epoch(pipe, epoch)
    reset_pipeline(pipe)
    load_pipeline_state_dict(pipe, state)
    return _drain(BlockingReader(pipe))


def _in_a_fresh_thread(work: Callable[[], list[Any]]) -> list[Any]:
    """``work()`` run in a new thread, as a resume in a fresh process runs: nothing of the
    interrupted run (such as the thread's item stamp) can leak into the resumed one."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.extend(work())
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller
            errors.append(error)

    thread = threading.Thread(target=run, name="pipeloom-resume-check")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result


def _as_iter(pipe: DataPipe) -> IterDataPipe:
    if not isinstance(pipe, IterDataPipe):
        raise TypeError(f"expected a factory of IterDataPipe, got {type(pipe).__name__}")
    return pipe


def _services(workers: int) -> dict[str, Callable[[], ReadingService]]:
    def processes(strategy: str) -> Callable[[], ReadingService]:
        return lambda: MultiProcessingReadingService(workers, strategy=strategy, timeout=60)

    return {
        "threads": lambda: ThreadReadingService(workers),
        "classic": processes("classic"),
        "economic": processes("economic"),
        "chunked": processes("chunked"),
    }


def check_same_output_everywhere(
    make_pipe: Callable[[], DataPipe],
    *,
    seed: int = 0,
    epochs: int = 1,
    workers: int = 2,
) -> list[str]:
    """Run the pipeline in-process, in threads and under each process strategy; compare.

    Every service whose planner accepts the pipeline (threads and the classic
    strategy need a sharding point; economic and chunked a ``.batch()`` after
    the per-item blocks) must yield the same items in the same order, each
    with the same ``item_rng()`` stream: a last block records the first draw
    of every output, which depends only on the output's item stamp.

    Returns:
        the services that ran (``"in-process"`` first).

    Raises:
        AssertionError: naming the service, epoch and first output that differ.
    """

    def run(service: ReadingService) -> list[list[Any]]:
        pipe = _as_iter(make_pipe()).map(_with_first_draw)
        with DataLoader(pipe, service, seed=seed) as loader:
            return [list(loader) for _ in range(epochs)]

    expected = run(InProcessReadingService())
    ran = ["in-process"]
    for name, make_service in _services(workers).items():
        try:
            got = run(make_service())
        except PlanError:
            continue  # the planner does not run this pipeline that way (and says why)
        for epoch, (want, have) in enumerate(zip(expected, got)):
            _compare(want, have, f"{name}, epoch {epoch}")
        ran.append(name)
    return ran


def _with_first_draw(output: Any) -> tuple[Any, float]:
    return output, float(_item_rng().random())


def _compare(expected: list[Any], got: list[Any], where: str) -> None:
    for index, (want, have) in enumerate(zip(expected, got)):
        if not _same(want[0], have[0]):
            raise AssertionError(
                f"{where}: output {index} differs from the in-process run:\n"
                f"  expected {want[0]!r}\n  got      {have[0]!r}"
            )
        if want[1] != have[1]:
            raise AssertionError(
                f"{where}: output {index} ({want[0]!r}) draws other item_rng() values than "
                f"in-process ({have[1]} instead of {want[1]}): its item stamp differs"
            )
    if len(expected) != len(got):
        raise AssertionError(
            f"{where}: {len(got)} outputs where the in-process run gave {len(expected)}"
        )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)
