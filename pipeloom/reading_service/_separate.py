"""Blocks marked ``is_separate_process()``: each runs, with its upstream, in a process of its own.

The main pipeline reads such a block through a :class:`SeparateProcessReader`
that stands in its place: a process runs a copy of the block and everything
upstream of it, and sends ``(stamp, item)`` through a shared-memory
queue, so item stamps (and ``item_rng()``) are the same as in-process.
"""

from __future__ import annotations

import os
import signal
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from ..datapipes import DataPipe, IterDataPipe
from ..datapipes.runtime import forget_lazy_init, restore_stamp
from ..errors import NotAvailable, QueueError, WorkerError
from ..events import FdReadiness, ReadinessSource
from ..graph import find, replace, upstream
from ..queues import ProcessQueue
from ._failure import Failure
from ._merge import END
from ._pickling import dumps_pipeline, loads_pipeline
from ._process_exit import describe_exit, exit_code
from ._start import worker_context
from ._worker_loop import produce_epoch

__all__ = ["SeparateProcessReader", "split_separate_processes"]


def split_separate_processes(
    main: IterDataPipe,
    *,
    start_method: str | None,
    prefetch: int,
    forbidden: DataPipe | None = None,
) -> tuple[IterDataPipe, list[SeparateProcessReader]]:
    """Replace each marked block of ``main`` by a reader of its own process.

    ``forbidden`` (e.g. the workers' merge) may not be upstream of a marked
    block: its items can only be read in the main process.
    """
    readers: list[SeparateProcessReader] = []
    marked: list[Any] = find(main, lambda b: b.is_separate_process())
    for block in marked:
        if not isinstance(block, IterDataPipe):
            raise TypeError(f"only iterable blocks can run in a separate process, got {block!r}")
        if forbidden is not None and any(b is forbidden for b in upstream(block)):
            raise ValueError(
                f"{block!r} asks for a separate process, but it reads the workers' output, "
                f"which only the main process can receive. Drop the mark, or mark a block on a "
                f"branch that the workers neither run nor feed (e.g. a side stream zipped with "
                f"their output)"
            )
        reader = SeparateProcessReader(block, start_method=start_method, prefetch=prefetch)
        main = replace(main, block, reader)  # type: ignore[assignment]
        readers.append(reader)
    return main, readers


class SeparateProcessReader(IterDataPipe):
    """Reads a block that runs in a process of its own."""

    inputs = ()  # the block runs in the other process

    def __init__(self, block: IterDataPipe, *, start_method: str | None, prefetch: int) -> None:
        self.block_repr = repr(block)
        context: Any = worker_context(start_method)
        self._context = context
        self._payload: Any = (
            block if context.get_start_method() == "fork" else dumps_pipeline(block)
        )
        self.capacity = prefetch
        self._process: Any = None
        self._queue: ProcessQueue | None = None
        self._finalizer: weakref.finalize | None = None
        self._ended = False

    def start(self, epoch: int) -> None:
        """Start the process for ``epoch`` (stopping a previous one)."""
        self.stop()
        self._queue = ProcessQueue(capacity=self.capacity, owner="consumer")
        self._process = self._context.Process(
            target=_separate_main,
            args=(self._payload, self._queue, epoch, self.block_repr),
            name="pipeloom-separate",
            daemon=True,
        )
        self._process.start()
        self._finalizer = weakref.finalize(self, _stop, self._process, self._queue)
        self._ended = False

    def stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None

    def readiness_sources(self) -> Sequence[ReadinessSource]:
        if self._queue is None:
            return ()
        return [self._queue.readiness(), FdReadiness(self._process.sentinel)]

    def async_next(self) -> Any:
        if self._ended or self._queue is None:
            raise StopIteration
        try:
            message = self._queue.get(block=False)
        except NotAvailable:
            if exit_code(self._process) is not None:
                self._raise_died(None)
            raise
        except QueueError as error:
            self._raise_died(error)
        if message is END:
            self._ended = True
            raise StopIteration
        if isinstance(message, Failure):
            message.raise_here()
        stamp, item = message
        restore_stamp(stamp)
        return item

    def _raise_died(self, cause: BaseException | None) -> None:
        self._process.join(timeout=5)
        code = self._process.exitcode
        how = "closed its queue" if code is None else describe_exit(code)
        raise WorkerError(
            f"the separate process of {self.block_repr} (pid {self._process.pid}) {how}",
            worker=f"separate process {self._process.pid}",
            block=self.block_repr,
        ) from cause

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a SeparateProcessReader cannot be copied to another process")

    def __repr__(self) -> str:
        return f"SeparateProcessReader({self.block_repr})"


def _stop(process: Any, queue: ProcessQueue) -> None:
    queue.close()
    process.join(timeout=1.0)
    if process.exitcode is None:
        process.kill()
        process.join(timeout=5)


def _separate_main(payload: Any, queue: ProcessQueue, epoch: int, label: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    restore_stamp((None, epoch, None))
    # One intra-op thread per worker, as torch does; a forked child must not use the
    # OpenMP pool it inherited from a parent that already ran parallel torch ops.
    torch.set_num_threads(1)
    if isinstance(payload, bytes):
        pipe = loads_pipeline(payload)
    else:
        pipe = payload
        forget_lazy_init(pipe)
    produce_epoch(
        pipe,
        queue.put,
        epoch=epoch,
        worker_label=f"separate process {os.getpid()} for {label}",
        full_stamp=True,
    )
