"""The main process's end of one Ray actor for one epoch: its runs, one message at a time.

A reader thread makes the epoch's one streaming call on the actor, takes each
run Ray streams back (``ray.get`` of a NumPy array is a zero-copy view of the
object store on the same node) and hands it over through a one-run
:class:`~pipeloom.queues.ThreadQueue`, whose readiness wakes the merge: no
polling. The merge reads the channel as it reads a classic worker's queue
(``get_nowait``, ``readiness``).

When the actor dies, Ray restarts it (``max_restarts``); the reader makes the
call again from the last output it received (position and outputs already
taken there), so nothing is lost and nothing comes twice. Once the restarts
are spent, the channel raises a ``WorkerError`` naming the actor, its node
and the cause.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from typing import Any

from ....datapipes.runtime import key_position
from ....errors import QueueError, WorkerError
from ....events import ReadinessSource
from ....queues import ThreadQueue
from ...workers.failure import Failure
from ...workers.messages import END
from .handle import ActorHandle, require_ray

__all__ = ["ActorChannel", "Replay"]

JOIN_TIMEOUT = 10.0
"""Seconds to wait for a reader thread to end after its epoch was cancelled."""


class Replay:
    """Where a restarted actor resumes: after the last output the main process received.

    Mirrors the merge's own checkpoint: ``position`` and the outputs already
    received there (``skip``); when each group of ``group_size`` positions yields
    one output, the next group instead.

    Example:
        >>> replay = Replay(resume=None, group_size=1, single_output=False)
        >>> for key in (0, 2, 2):
        ...     replay.received(key)
        >>> replay.resume, replay.skip
        (2, 2)
        >>> for key in ((3, 0), (3, 1)):  # two outputs of position 3 (a flatmap)
        ...     replay.received(key)
        >>> replay.resume, replay.skip
        (3, 2)
    """

    def __init__(self, *, resume: int | None, group_size: int, single_output: bool) -> None:
        self.resume = resume
        self.skip = 0
        self.group_size = group_size
        self.single_output = single_output
        self.replayable = True

    def received(self, key: Any) -> None:
        """Note an output the main process received (``key``: its item key)."""
        position = key_position(key)  # outputs (p, j) of one position share p
        if position is None:  # an output without a position cannot be found again
            self.replayable = False
        elif self.single_output:
            self.resume, self.skip = (position // self.group_size + 1) * self.group_size, 0
        elif position == self.resume:
            self.skip += 1
        else:
            self.resume, self.skip = position, 1


class ActorChannel:
    """One actor's outputs for one epoch, read by a thread, restarted when the actor dies.

    Args:
        actor: the actor and what the pool knows about it.
        epoch: the epoch to produce.
        replay: where the epoch starts (and is replayed from after a restart).
        prefetch: runs the actor may hold in the object store ahead of the reader.
    """

    def __init__(self, actor: ActorHandle, *, epoch: int, replay: Replay, prefetch: int) -> None:
        self.actor = actor
        self.epoch = epoch
        self.replay = replay
        self.prefetch = prefetch
        self.queue = ThreadQueue(capacity=1)
        self._run: collections.deque[Any] = collections.deque()
        self._lock = threading.Lock()
        self._cancelled = False
        self._call: Any = None  # the running ObjectRefGenerator
        self._thread = threading.Thread(
            target=self._read, name=f"pipeloom-ray-reader-{actor.index}", daemon=True
        )
        self._thread.start()

    # -- the merge's side --------------------------------------------------------------
    def get_nowait(self) -> Any:
        if not self._run:
            run = self.queue.get(block=False)  # NotAvailable propagates
            if isinstance(run, BaseException):
                raise run
            self._run.extend(run)
        return self._run.popleft()

    def readiness(self) -> Sequence[ReadinessSource]:
        return [self.queue.readiness()]

    def cancel(self) -> None:
        """Stop the epoch: cancel the call, close the hand-over; idempotent.

        The reader is not joined: a call stuck in an item (what a ``timeout``
        reports) ends only at its next output, or when the pool kills the
        actor (at the next epoch, or at its stop). Until then the reader waits
        on it; whatever it then gets meets the closed hand-over or
        ``_cancelled`` and ends it.
        """
        with self._lock:
            self._cancelled = True
            call, self._call = self._call, None
        if call is not None:
            _cancel(call)
        self.queue.close()

    def reading(self) -> bool:
        """True while the reader thread runs."""
        return self._thread.is_alive()

    def join(self, timeout: float = JOIN_TIMEOUT) -> None:
        """Wait (at most ``timeout`` seconds) for the reader thread to end."""
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout)

    # -- the reader thread -------------------------------------------------------------
    def _read(self) -> None:
        ray = require_ray()
        lost = _lost_errors(ray)
        try:
            call = self._submit()
            while call is not None:
                try:
                    run = ray.get(next(call))
                except StopIteration:
                    return
                except ray.exceptions.TaskCancelledError:
                    return
                except lost as error:
                    call = self._restart(call, error)
                    continue
                for message in run:
                    if message is not END and not isinstance(message, Failure):
                        self.replay.received(message[0])
                self.queue.put(run)
                if run and (run[-1] is END or isinstance(run[-1], Failure)):
                    return
        except QueueError:
            return  # cancelled: nobody reads any more
        except Exception as error:  # noqa: BLE001 - everything goes to the merge
            self._hand_over(_as_worker_error(error, self.actor.label, ray.is_initialized()))

    def _submit(self) -> Any:
        with self._lock:
            if self._cancelled:
                return None
            self._call = self.actor.start_epoch(
                self.epoch, self.replay.resume, self.replay.skip, self.prefetch
            )
            return self._call

    def _restart(self, call: Any, error: BaseException) -> Any:
        """The call again on the restarted actor, or raise once Ray restarts it no more."""
        if self._cancelled:
            return None
        require_ray().cancel(call)  # still running if only its objects were lost
        if not self.replay.replayable:
            raise self.actor.lost(
                error, "and its outputs carry no source position, so the epoch cannot be replayed"
            )
        self.actor.restarted(error)  # raises a WorkerError when Ray restarts it no more
        return self._submit()

    def _hand_over(self, error: BaseException) -> None:
        try:
            self.queue.put(error)
        except QueueError:
            pass


def _cancel(call: Any) -> None:
    """Cancel ``call``; nothing when it is gone with Ray (``ray.shutdown()`` ran meanwhile).

    Ray's own ``TypeError: No owner found for object`` would otherwise replace
    the error that ended the epoch, which says what happened.
    """
    try:
        require_ray().cancel(call)
    except Exception:  # noqa: BLE001 - nothing left to cancel
        pass


def _lost_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """What ends a call when its actor or its node dies (objects in flight lost with it)."""
    return (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError)


def _as_worker_error(error: Exception, label: str, ray_up: bool) -> Exception:
    if isinstance(error, WorkerError):
        return error
    why = (
        ""
        if ray_up
        else " (Ray was shut down meanwhile: call the loader's shutdown(), or leave its "
        "with block, before ray.shutdown())"
    )
    wrapped = WorkerError(
        f"{label}: reading its outputs failed with {type(error).__name__}: {error}{why}",
        worker=label,
    )
    wrapped.__cause__ = error
    return wrapped
