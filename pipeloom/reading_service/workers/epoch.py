"""What a replica of a part of the pipeline does for one epoch, wherever it runs.

A classic worker (a thread or a process) and a separate process each call
:func:`produce_epoch`: start the epoch, send every output with its item stamp,
then ``END`` (or a ``Failure`` when the pipeline raised).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...datapipes import (
    BlockingReader,
    DataPipe,
    IterDataPipe,
    load_pipeline_state_dict,
    reset_pipeline,
    set_pipeline_epoch,
)
from ...datapipes.runtime import Key, current_stamp, restore_stamp
from ...errors import QueueError
from .failure import capture_failure, unsendable_failure
from .messages import END

__all__ = ["EpochCancelled", "produce_epoch", "send_end", "send_failure"]


class EpochCancelled(QueueError):
    """Raised by a worker's ``put`` when the main process abandoned the epoch."""


def produce_epoch(
    pipe: IterDataPipe,
    put: Callable[[Any], None],
    *,
    epoch: int,
    worker_label: str,
    state: dict | None = None,
    full_stamp: bool = False,
    resume: tuple[DataPipe, Any] | None = None,
) -> bool:
    """Send an ``Output`` for every output of ``pipe`` this epoch, then ``END``.

    ``resume=(sharding point, position)`` fast-forwards the sharding point (a
    block of ``pipe``) to ``position``: only the cheap part upstream replays.
    With ``full_stamp`` each message is a ``StampedOutput`` instead. An
    exception from the pipeline is sent as a ``Failure``. Returns False when
    the consumer is gone for good (its queue is closed or broken); True
    otherwise, also when the epoch was cancelled (``put`` raised
    :class:`EpochCancelled`).
    """
    restore_stamp((None, epoch, None))  # nothing inherited from a parent or a past epoch
    try:
        set_pipeline_epoch(pipe, epoch)
        reset_pipeline(pipe)
        if state is not None:
            load_pipeline_state_dict(pipe, state)
        if resume is not None:
            sharding_point, position = resume
            sharding_point.resume_at(position)
        reader = BlockingReader(pipe)
        while True:
            try:
                item = reader.next()
            except StopIteration:
                break
            stamp = current_stamp()
            try:
                put((stamp, item) if full_stamp else (stamp[2], stamp[3], item))
            except QueueError:
                raise
            except Exception as error:  # noqa: BLE001 - the output cannot cross processes
                outputs: list[tuple[Key | None, Any, Any]] = [(stamp[2], stamp[3], item)]
                put(unsendable_failure(error, worker_label, repr(pipe), outputs))
                return True
    except QueueError as error:
        return isinstance(error, EpochCancelled)
    except BaseException as error:  # noqa: BLE001 - every failure goes to the consumer
        return send_failure(put, error, worker_label)
    return send_end(put)


def send_failure(put: Callable[[Any], None], error: BaseException, worker_label: str) -> bool:
    """Send ``error`` to the consumer as a ``Failure``; re-raise it unless it is an ``Exception``.

    Returns False when the consumer is gone for good, True otherwise (also
    when the epoch was cancelled).
    """
    try:
        put(capture_failure(error, worker_label))
    except QueueError as queue_error:
        return isinstance(queue_error, EpochCancelled)
    if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit: the worker stops
        raise error
    return True


def send_end(put: Callable[[Any], None]) -> bool:
    """Send ``END``; False when the consumer is gone for good."""
    try:
        put(END)
    except QueueError as error:
        return isinstance(error, EpochCancelled)
    return True
