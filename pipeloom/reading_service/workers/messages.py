"""Everything that crosses between the main process and its workers.

Outputs travel one message per item, so they stay plain tuples (the queues
send small tuples of builtins fastest); everything else is a small
``NamedTuple`` whose type says what it is.

Outputs, from a worker to whoever reads it:

* :data:`Output` ``(key, draws, item)``: one output of a worker; ``key`` is
  its position ``p`` or ``(p, j, ...)`` (output ``j`` of the item at ``p``),
  ``draws`` counts the item seeds already drawn for it, so ``item_rng()`` goes
  on where the worker stopped. Classic workers (threads and processes) send these, and
  economic/chunked workers send lists of them.
* :data:`StampedOutput` ``(stamp, item)``: one output of a separate process,
  whose blocks stamp items with seeds of their own.
* :data:`END` after a worker's last output of an epoch; a
  :class:`~.failure.Failure` instead of an output when the pipeline raised.

Control of a classic worker process (over its control pipe):
:class:`StartEpoch`, :class:`Stop`.

Economic and chunked (every message carries the *generation* ``gen`` of the
epoch it belongs to, so the leftovers of an abandoned epoch are dropped):
main -> item worker :class:`EpochStart`, :class:`Task`, :class:`Stop`;
item worker -> item worker :class:`Relay` (chunked building batches of a per-item
part that is not one to one: the items of a chunk that do not fill a batch);
item worker -> batch worker (or main, when ``dest`` is :data:`MAIN`)
:class:`TaskResult`; main -> batch worker :class:`EpochStart`,
:class:`BatchSize`, :class:`Stop`; batch worker -> main :class:`BatchResult`;
item worker -> main :class:`InitFailed`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ...datapipes.runtime import ItemStamp, RestOfEpoch
from .failure import Failure

__all__ = [
    "END",
    "MAIN",
    "BatchResult",
    "BatchSize",
    "EpochStart",
    "InitFailed",
    "Output",
    "Relay",
    "RelayOrder",
    "RunDone",
    "StampedOutput",
    "StartEpoch",
    "Stop",
    "Task",
    "TaskResult",
]

Output = tuple[int | tuple[int, ...] | None, int, Any]
"""``(key, draws, item)``: one output of a worker (key: ``p`` or ``(p, j, ...)``)."""

StampedOutput = tuple[ItemStamp, Any]
"""``(stamp, item)``: one output of a separate process, with its full item stamp."""

MAIN = -1
"""The ``dest`` of a :class:`TaskResult` that goes straight to the main process."""


class _End:
    """Sent by a worker after its last output of the epoch."""

    def __reduce__(self) -> str:
        return "END"  # unpickles as this module's END: identity survives the queue

    def __repr__(self) -> str:
        return "END"


END = _End()


class StartEpoch(NamedTuple):
    """Classic worker process: produce ``epoch``, from ``resume`` (a position) when given.

    ``skip``: outputs of that position delivered before (workers that build
    batches of items they cannot count in advance; ``strategies/classic/assemble.py``).
    """

    epoch: int
    resume: int | RestOfEpoch | None = None  # RestOfEpoch: resumed on other ranks
    skip: int = 0


class RunDone(NamedTuple):
    """Classic worker building assembled batches -> main: run ``run`` is all sent;
    ``final``: it was the epoch's last (``strategies/classic/assemble.py``)."""

    run: int
    final: bool


class Stop(NamedTuple):
    """Any worker process: exit."""


class EpochStart(NamedTuple):
    """Economic/chunked worker: epoch generation ``gen`` is ``epoch``; stamp with ``stamp_seed``."""

    gen: int
    epoch: int
    stamp_seed: int | None


class RelayOrder(NamedTuple):
    """How a chunk's outputs join the epoch's batches (``dispatch/relay.py``).

    The items that earlier chunks left over (fewer than a batch) come from
    item worker ``pred`` with the relay of chunk ``pred_unit`` (``pred`` -1:
    none, this is the epoch's first chunk, whose first ``skip`` outputs were
    delivered before a resume); what this chunk
    leaves over goes to item worker ``succ``. ``final``: no more chunks, build
    the short last batch of what is left over.
    """

    pred: int
    pred_unit: int
    succ: int
    skip: int = 0
    final: bool = False


class Task(NamedTuple):
    """Item worker: run the per-item blocks on ``entries`` (``(position, value)`` pairs).

    The outputs belong to unit ``unit`` (a batch or a chunk) and go to batch
    worker ``dest`` (or the main process when ``dest`` is :data:`MAIN`). An
    item worker that builds whole batches builds one of ``entries`` unless
    ``whole`` is False (a chunk of a batch the main process builds), or, with
    ``relay``, the batches the chunk completes (``dispatch/relay.py``).
    """

    gen: int
    unit: int
    dest: int
    entries: list[tuple[int, Any]]
    whole: bool = True
    relay: RelayOrder | None = None


class Relay(NamedTuple):
    """Item worker -> item worker: the outputs of the chunks up to ``unit`` not in a
    batch yet (packed ``(key, draws, item)``), each one's resume point ``after``;
    or ``stop``: that chunk failed, so no batch of epoch ``gen`` follows. ``last``:
    the position of the last output so far and how many outputs it made (its items
    may go on in the next chunk); ``skip``: outputs delivered before a resume that
    are still to be dropped."""

    gen: int
    unit: int
    items: Any
    after: list[tuple[int, int]]
    stop: bool = False
    last: tuple[int, int] = (-1, 0)
    skip: int = 0


class TaskResult(NamedTuple):
    """Item worker -> ``dest``: the outputs of a task of ``task_size`` items, or its failure.

    ``partial``: some of them, sent before the rest (the batches of the epoch's first
    relayed chunk, each as soon as it is full); a result without it follows.
    """

    gen: int
    unit: int
    outputs: list[Output] | Failure
    task_size: int
    partial: bool = False


class BatchSize(NamedTuple):
    """Batch worker: unit ``unit`` has ``size`` items, all assigned to item workers."""

    gen: int
    unit: int
    size: int


class BatchResult(NamedTuple):
    """Batch worker -> main: the outputs of unit ``unit`` (the batch), or its failure."""

    gen: int
    unit: int
    outputs: list[Output] | Failure


class InitFailed(NamedTuple):
    """Item worker -> main: ``worker_init_fn`` raised; the worker exits."""

    gen: int
    failure: Failure
