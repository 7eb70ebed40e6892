"""Ray itself, as the Ray strategy sees it: the import, the cluster, one actor's handle.

Ray is optional (``pipeloom[ray]``): nothing imports it before
:func:`require_ray`, which the service calls first. :class:`Cluster`
connects to a running cluster (or starts a local one) and, when it started
it, stops it again. :class:`ActorHandle` is one actor as the pool and its
channel see it: its label (actor, pid, node), its epoch call, its restarts.
"""

from __future__ import annotations

import threading
from typing import Any

from ....errors import WorkerError

__all__ = ["ActorHandle", "Cluster", "require_ray"]

EXTRA = "pipeloom[ray]"


def require_ray(what: str = "RayReadingService") -> Any:
    """The ``ray`` module, imported on first use; ImportError naming the extra without it.

    Importing Ray takes a second: ``import pipeloom`` (in every worker process
    too) must not pay for it, so nothing imports Ray before a Ray service runs.
    """
    try:
        import ray
        import ray.exceptions  # noqa: F401 - ray.exceptions.* is used by the callers
    except ImportError as error:
        raise ImportError(
            f"{what} needs Ray, which is not installed; install the extra with "
            f"pip install '{EXTRA}' (or pip install 'ray==2.60.*')"
        ) from error
    return ray


class _Started:
    """The local cluster a ``Cluster`` of this process started, and who uses it.

    Every service connecting while it runs shares it; the last to release it
    stops it, so one loader's ``shutdown()`` never stops Ray under another's
    actors. ``job`` tells it from a connection made since by someone else.
    """

    lock = threading.Lock()
    job: str | None = None  # the Ray job of the connection started here
    users = 0


class Cluster:
    """The Ray cluster the actors run on: the connected one, or one started here.

    Args:
        address: ``ray.init(address=...)`` when Ray is not connected yet (None:
            ``RAY_ADDRESS`` if set, else a new local cluster). A connection
            that already exists is used as it is.
    """

    def __init__(self, address: str | None) -> None:
        self.address = address
        self.owned = False  # this object counts among the users of the one started here

    def connect(self) -> None:
        ray = require_ray()
        with _Started.lock:
            if not ray.is_initialized():
                ray.init(address=self.address, include_dashboard=False, configure_logging=False)
                _Started.job, _Started.users = _job(ray), 0
            if not self.owned and _Started.job is not None and _Started.job == _job(ray):
                _Started.users += 1
                self.owned = True

    def release(self) -> None:
        """Stop the cluster if this object started it and no other uses it; idempotent."""
        if not self.owned:
            return
        self.owned = False
        ray = require_ray()
        with _Started.lock:
            _Started.users -= 1
            if _Started.users > 0:
                return
            started, _Started.job = _Started.job, None
            if ray.is_initialized() and _job(ray) == started:
                ray.shutdown()


def _job(ray: Any) -> str:
    """The current connection's Ray job (a new one at each ``ray.init``)."""
    return str(ray.get_runtime_context().get_job_id())


class ActorHandle:
    """One actor of the pool: where it runs, its streaming epoch call, its restarts.

    Ray restarts the actor after each death, up to ``max_restarts`` times over
    its life, and counts them itself: a death in an epoch, between epochs or
    in an abandoned epoch counts alike. An actor Ray restarts no more is
    ``dead``; so is one the pool killed. The pool replaces it at the next epoch.

    Args:
        handle: the Ray actor handle.
        index: the actor's index in the pool.
        max_restarts: how many times Ray restarts it (and the epoch is replayed).
        start_timeout: seconds to wait for it to run (again, after a restart).
    """

    def __init__(self, handle: Any, index: int, *, max_restarts: int, start_timeout: float):
        self.handle = handle
        self.index = index
        self.max_restarts = max_restarts
        self.start_timeout = start_timeout
        self.dead = False
        self.where: dict[str, Any] = {}

    @property
    def label(self) -> str:
        """``ray actor 0 (actor 1a2b3c4d, pid 4242, node 10.0.0.5 id 5e6f7a8b)``."""
        if not self.where:
            return f"ray actor {self.index}"
        w = self.where
        return (
            f"ray actor {self.index} (actor {w['actor_id'][:8]}, pid {w['pid']}, "
            f"node {w['node_ip']} id {w['node_id'][:8]})"
        )

    def locate(self) -> Any:
        """A reference to :meth:`EpochActor.where`; it runs beside a running epoch.

        Ray retries it while the actor restarts and fails it once the actor is
        dead for good, so waiting on it waits for the restart without polling.
        """
        method = self.handle.where.options(concurrency_group="control", max_task_retries=-1)
        return method.remote()

    def start_epoch(self, epoch: int, resume: int | None, skip: int, prefetch: int) -> Any:
        """The epoch's one streaming call; at most ``prefetch`` runs wait in the object store."""
        method = self.handle.epoch.options(
            num_returns="streaming", _generator_backpressure_num_objects=prefetch
        )
        return method.remote(epoch, resume, skip)

    def restarted(self, error: BaseException) -> None:
        """Wait for Ray to restart the actor after ``error`` killed its call.

        Raises:
            WorkerError: when Ray restarts it no more (its ``max_restarts``
                restarts are spent, or it was killed for good), or it did not run
                again within ``start_timeout`` seconds; the actor is then ``dead``.
        """
        ray = require_ray()
        try:
            self.where = ray.get(self.locate(), timeout=self.start_timeout)
        except ray.exceptions.GetTimeoutError:
            self.dead = True
            raise self.lost(
                error,
                f"and did not run again within {self.start_timeout} s (start_timeout); "
                f"is a node with num_cpus_per_actor free CPUs left in the cluster?",
            ) from None
        except ray.exceptions.RayActorError as dead:  # Ray restarts it no more
            self.dead = True
            raise self.lost(dead, self._no_more_restarts()) from None

    def _no_more_restarts(self) -> str:
        """Why Ray restarts the actor no more, by its own count of the restarts."""
        restarts = self.restarts()
        if restarts is not None and restarts < self.max_restarts:
            return (
                f"and Ray restarts it no more after {restarts} of its {self.max_restarts} "
                f"restarts (max_restarts): the cause says why (ray.kill, or its constructor "
                f"failed on restart); the next epoch starts a fresh actor in its place"
            )
        return (
            f"and its {self.max_restarts} restarts (max_restarts, counted over its life, "
            f"across epochs) are spent; the next epoch starts a fresh actor in its place. "
            f"Raise max_restarts, or read the actor's log (ray logs) for why it dies"
        )

    def restarts(self) -> int | None:
        """How many times Ray restarted this actor (None where Ray does not say)."""
        try:
            from ray._private import state  # Ray's actor table: its count, not ours

            return int(state.actors(self.where["actor_id"])["NumRestarts"])
        except Exception:  # noqa: BLE001 - not located yet, or another Ray version
            return None

    def lost(self, error: BaseException, why: str) -> WorkerError:
        """The error for this actor's death before the end of its epoch."""
        cause = " ".join(str(error).split())
        if len(cause) > 600:
            cause = cause[:600] + " ..."
        lost = WorkerError(
            f"{self.label} died before finishing its epoch {why}. "
            f"Cause ({type(error).__name__}): {cause}",
            worker=self.label,
        )
        lost.__cause__ = error
        return lost

    def kill(self) -> None:
        """End the actor for good (no restart); idempotent."""
        self.dead = True
        try:
            require_ray().kill(self.handle, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone, or Ray is shut down
            pass
