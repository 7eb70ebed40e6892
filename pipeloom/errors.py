"""The exceptions pipeloom raises.

The tree::

    Exception
    ├── NotAvailable          nothing ready yet; ask again later (never an error)
    └── PipeloomError
        ├── QueueError        the queue is closed or its peer is gone
        ├── WorkerError       a block failed in a worker; carries its origin (a RuntimeError)
        ├── WorkerTimeout     no item within the service's timeout (a TimeoutError, RuntimeError)
        ├── StateError        a state_dict cannot be taken or loaded
        ├── PlanError         a service cannot place the pipeline as asked (a ValueError)
        └── DistributedError  another rank failed, crashed or timed out in a collective

End of stream is the builtin ``StopIteration``; bad arguments raise the builtin
``TypeError``/``ValueError``; lifecycle misuse raises ``RuntimeError``.
"""

from __future__ import annotations

__all__ = [
    "DistributedError",
    "LoaderShutDown",
    "NotAvailable",
    "PipeloomError",
    "PlanError",
    "QueueError",
    "StateError",
    "WorkerError",
    "WorkerTimeout",
]


class NotAvailable(Exception):
    """Raised by a non-blocking call when no item is ready yet.

    It is a signal, not a failure: the caller may do other work and ask again,
    or wait on the block's readiness sources (see ``pipeloom.events``).
    """


class PipeloomError(Exception):
    """Base class of pipeloom's own failures."""


class QueueError(PipeloomError):
    """A queue was closed, or the process or thread at its other end died."""


class WorkerTimeout(PipeloomError, TimeoutError, RuntimeError):
    """The workers delivered nothing within the reading service's ``timeout``.

    A ``TimeoutError``, and a ``RuntimeError`` as torch's ``DataLoader`` raises
    on its ``timeout``, so ``except RuntimeError`` written for torch catches it.
    """


class StateError(PipeloomError):
    """A pipeline state could not be saved or restored."""


class LoaderShutDown(PipeloomError, RuntimeError):
    """``shutdown()`` was called from another thread while this thread's ``next()`` waited.

    Raised by that ``next()``, at once, instead of waiting on for an item that
    may never come (a stuck worker); also by an ``iter()`` that waited while
    re-reading the items a loaded state had delivered. A ``RuntimeError``, as other uses of a
    shut-down loader raise.
    """


class PlanError(PipeloomError, ValueError):
    """A reading service cannot place the pipeline the way it was asked; the message says why.

    Raised when a loader is built or its epoch starts: e.g. a strategy that
    cannot split the pipeline, or a separate-process block it cannot place.
    """


class StateOfAnotherService(StateError):
    """A state saved by another reading service or strategy, whose blocks at the point where
    the main process reads the workers differ: ``DataLoader`` then resumes it by replay."""


class DistributedError(PipeloomError):
    """The ranks of a distributed job could not agree: one failed, crashed or is stuck.

    Raised on the surviving ranks, within the process group's timeout; the
    failing rank's own output has the first error.
    """


class WorkerError(PipeloomError, RuntimeError):
    """An exception raised inside a worker, re-raised where the items are consumed.

    Also a ``RuntimeError``, which torch's ``DataLoader`` raises for a worker
    that died, so ``except RuntimeError`` written for torch catches it.

    Attributes:
        worker: a label for the worker (e.g. ``"process worker 2 (pid 4242)"``).
        block: ``repr`` of the block that raised, when known.
        item: the position of the item being produced, when known.
        item_repr: a short description of that item (a sample's ``__key__``, or a
            truncated ``repr``), when known.
        original_type: the class name of the original exception.
        traceback_text: the formatted traceback from the worker.
        dead_pid: the pid of the worker process that died (or closed its queue)
            before finishing its epoch; None when the worker did not die (a block
            raised there) or is not a process of its own.
        exit_code: how that process ended, as ``multiprocessing`` gives it: ``-9``
            for ``SIGKILL`` (minus the signal's number), ``1`` for an exit with
            code 1; None when it did not die or was still exiting.
    """

    def __init__(
        self,
        message: str,
        *,
        worker: str | None = None,
        block: str | None = None,
        item: int | None = None,
        original_type: str | None = None,
        traceback_text: str | None = None,
        item_repr: str | None = None,
        dead_pid: int | None = None,
        exit_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.dead_pid = dead_pid
        self.exit_code = exit_code
        self.item_repr = item_repr
        self.worker = worker
        self.block = block
        self.item = item
        self.original_type = original_type
        self.traceback_text = traceback_text

    def add_detail(self, text: str, item: int | None = None) -> None:
        """Append ``text`` to the message (e.g. what a dead worker was making); set ``item``."""
        if item is not None:
            self.item = item
        self.args = (f"{self.args[0] if self.args else ''}{text}", *self.args[1:])

    def __reduce__(self):  # keep the keyword attributes across pickling
        return (
            _rebuild_worker_error,
            (
                self.args[0] if self.args else "",
                self.worker,
                self.block,
                self.item,
                self.original_type,
                self.traceback_text,
                self.item_repr,
                self.dead_pid,
                self.exit_code,
            ),
        )


def _rebuild_worker_error(
    message,
    worker,
    block,
    item,
    original_type,
    traceback_text,
    item_repr=None,
    dead_pid=None,
    exit_code=None,
):
    return WorkerError(
        message,
        worker=worker,
        block=block,
        item=item,
        original_type=original_type,
        traceback_text=traceback_text,
        item_repr=item_repr,
        dead_pid=dead_pid,
        exit_code=exit_code,
    )
