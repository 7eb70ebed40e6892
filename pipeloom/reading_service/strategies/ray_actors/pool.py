"""Classic workers as Ray actors: the pool the classic runner drives, one actor per worker.

The Ray strategy is the classic strategy with actors for processes: the same
plan (``planning/planner.py``, strategy ``"ray"``), the same runner and merge
(``strategies/classic/``), the same epoch of a worker (``workers/epoch.py``).
This pool starts the actors at the first epoch and keeps them until
:meth:`RayPool.stop`; each epoch is one streaming call per actor, read by an
:class:`~.channel.ActorChannel`. An actor whose call in an abandoned epoch
does not end (stuck in an item: what a ``timeout`` or Ctrl-C leaves behind)
would hold the next epoch's call back (an actor runs one call at a time):
the next epoch kills it and starts a fresh one in its place, as it does for
an actor Ray restarts no more (``ActorHandle.dead``).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ....datapipes.runtime import RestOfEpoch
from ....errors import StateError
from ....graph import Plan
from ...planning.cut import single_output
from ...planning.sharding import index_in_part
from ...workers.process import Payload
from ..classic.merge import WorkerChannel
from .actor import EpochActor, Shard
from .channel import ActorChannel, Replay
from .handle import ActorHandle, Cluster, require_ray

__all__ = ["RUN_LENGTH", "STUCK_AFTER", "ActorOptions", "RayPool"]

RUN_LENGTH = 64
"""The most item outputs in one object of the stream (whole batches travel one per object)."""

STUCK_AFTER = 5.0
"""Seconds (the service's ``timeout`` if less) an abandoned epoch's call may run on once
the next epoch starts; an actor whose call runs on longer is stuck, and replaced."""


class ActorOptions:
    """How the actors are started (the service's arguments).

    Attributes:
        num_cpus: CPUs Ray reserves for each actor (fractions allowed).
        max_restarts: Ray's restarts of each actor, over its life, before its death ends the epoch.
        start_timeout: seconds an actor may take to run (again).
        worker_init_fn: called as ``worker_init_fn(index)`` in each actor process.
        ray_options: more ``ray.remote`` options for the actors (e.g. ``resources``).
        stuck_after: seconds an abandoned epoch's call may run on at the next epoch.
    """

    def __init__(
        self,
        *,
        num_cpus: float,
        max_restarts: int,
        start_timeout: float,
        worker_init_fn: Callable[[int], None] | None,
        ray_options: dict[str, Any] | None,
        stuck_after: float = STUCK_AFTER,
    ) -> None:
        self.num_cpus = num_cpus
        self.max_restarts = max_restarts
        self.start_timeout = start_timeout
        self.stuck_after = stuck_after
        self.worker_init_fn = worker_init_fn
        self.ray_options = dict(ray_options or {})


class RayPool:
    """``count`` Ray actors running the workers' part of a plan.

    Args:
        plan: the plan; its ``"workers"`` part is what each actor runs.
        seed: the seed worker seeds derive from.
        count: actors.
        prefetch: runs each actor may hold in the object store ahead of the main process.
        options: how the actors are started.
        cluster: the cluster they run on (stopped at :meth:`stop` if started here).
    """

    def __init__(
        self,
        plan: Plan,
        *,
        seed: int,
        count: int,
        prefetch: int,
        options: ActorOptions,
        cluster: Cluster,
    ) -> None:
        workers = plan.part("workers")
        point = plan.sharding_point
        assert workers.exit is not None and point is not None
        try:
            self.payload = Payload(workers.exit, multiprocessing.get_context("spawn"))
        except TypeError as error:
            raise TypeError(
                f"RayReadingService cannot send the pipeline to its actors: {error}"
            ) from None
        self.shard = Shard(
            point_index=index_in_part(workers.exit, point),
            count=count,
            group_size=plan.group_size,
            outer=plan.outer,
        )
        self.group_size = plan.group_size
        self.single_output = single_output(workers.exit, point, plan.group_size)
        self.run_length = 1 if plan.group_size > 1 else RUN_LENGTH
        self.seed = seed
        self.count = count
        self.prefetch = prefetch
        self.options = options
        self.cluster = cluster
        self.actors: list[ActorHandle] = []
        self._channels: list[ActorChannel] = []
        self._cancelled: list[ActorChannel] = []  # readers of abandoned epochs, not joined yet

    def start_epoch(self, epoch: int, resume: int | RestOfEpoch | None) -> Sequence[WorkerChannel]:
        if isinstance(resume, RestOfEpoch):
            raise StateError(
                "RayReadingService cannot read the rest of an epoch saved on another number "
                "of ranks; resume it with MultiProcessingReadingService or ThreadReadingService "
                "inside the DistributedReadingService, or on the same number of ranks"
            )
        if not self.actors:
            self.actors = self._start_actors(range(self.count))
        else:
            self._replace_gone()
        self._channels = [
            ActorChannel(
                actor,
                epoch=epoch,
                replay=Replay(
                    resume=resume, group_size=self.group_size, single_output=self.single_output
                ),
                prefetch=self.prefetch,
            )
            for actor in self.actors
        ]
        return self._channels

    def finish_epoch(self, *, abandoned: bool) -> None:
        channels, self._channels = self._channels, []
        for channel in channels:
            if abandoned:
                channel.cancel()  # its reader may wait on a stuck item: joined at stop()
                self._cancelled.append(channel)
            else:
                channel.join()
        self._cancelled = [channel for channel in self._cancelled if channel.reading()]

    def queues(self) -> list[tuple[str, Any]]:
        """None to sample: the actors' outputs travel through Ray's object store."""
        return []

    def stop(self) -> None:
        """Cancel the epoch, end every actor, release the cluster; idempotent.

        The actors die before the readers are joined: that ends a reader
        waiting on an actor stuck in an item at once.
        """
        self.finish_epoch(abandoned=True)
        actors, self.actors = self.actors, []
        for actor in actors:
            actor.kill()
        cancelled, self._cancelled = self._cancelled, []
        for channel in cancelled:
            channel.join()
        self.cluster.release()

    def _replace_gone(self) -> None:
        """Start a fresh actor in place of each one dead (see ``ActorHandle``), or stuck.

        A cancelled call ends at the actor's next output; one still running
        ``stuck_after`` seconds after this epoch starts is stuck in an item, and
        this epoch's call would wait behind it: the actor is killed (which ends
        its reader) and replaced.
        """
        deadline = time.monotonic() + self.options.stuck_after
        for channel in self._cancelled:
            channel.join(timeout=max(0.0, deadline - time.monotonic()))
        for channel in self._cancelled:
            if channel.reading():
                channel.actor.kill()
        gone = [actor.index for actor in self.actors if actor.dead]
        if not gone:
            return
        for index in gone:  # also those Ray restarts no more, or did not place in time
            self.actors[index].kill()
        for channel in self._cancelled:
            channel.join()
        self._cancelled = [channel for channel in self._cancelled if channel.reading()]
        for actor in self._start_actors(gone):
            self.actors[actor.index] = actor

    def _start_actors(self, indices: Iterable[int]) -> list[ActorHandle]:
        """Start the actors of ``indices`` and wait for them to run; kill them if they do not."""
        self.cluster.connect()
        ray = require_ray()
        remote = ray.remote(
            num_cpus=self.options.num_cpus,
            max_restarts=self.options.max_restarts,
            max_task_retries=0,  # the channel replays the epoch itself, from where it stopped
            concurrency_groups={"control": 1},  # where() answers beside a running epoch
            **self.options.ray_options,
        )(EpochActor)
        actors = [
            ActorHandle(
                remote.remote(
                    self.payload,  # by value: Ray keeps a restartable actor's arguments
                    self.shard,
                    index,
                    self.seed,
                    self.run_length,
                    self.options.worker_init_fn,
                ),
                index,
                max_restarts=self.options.max_restarts,
                start_timeout=self.options.start_timeout,
            )
            for index in indices
        ]
        try:
            self._locate(actors)
        except BaseException:
            for actor in actors:
                actor.kill()
            raise
        return actors

    def _locate(self, actors: list[ActorHandle]) -> None:
        """Wait (at most ``start_timeout``) for every actor to run; learn where it runs."""
        ray = require_ray()
        calls = {actor.locate(): actor for actor in actors}
        ready, pending = ray.wait(
            list(calls), num_returns=len(calls), timeout=self.options.start_timeout
        )
        for call in ready:
            actor = calls[call]
            try:
                actor.where = ray.get(call)
            except ray.exceptions.RayActorError as error:
                raise actor.lost(error, "while starting (its constructor failed)") from error
        if pending:
            raise TimeoutError(
                f"{len(pending)} of {len(actors)} Ray actors did not start within "
                f"start_timeout={self.options.start_timeout} s; {self._asked(ray)}"
            )

    def _asked(self, ray: Any) -> str:
        """What each actor asks of the cluster, what it has free, and what to change."""
        free = ray.available_resources()
        asked = f"each asks for num_cpus_per_actor={self.options.num_cpus} CPUs"
        fixes = "lower num_actors or num_cpus_per_actor, or add nodes"
        resources = self.options.ray_options.get("resources") or {}
        if resources:
            asked += f" and ray_options resources {resources}"
            fixes += " that have those resources (ray start --resources=...)"
        if "scheduling_strategy" in self.options.ray_options:
            asked += " placed by ray_options scheduling_strategy"
            fixes += ", or check that the scheduling strategy can place them"
        has = {name: free.get(name, 0) for name in ["CPU", *resources]}
        return f"{asked}, and the cluster has {has} free: {fixes}"
