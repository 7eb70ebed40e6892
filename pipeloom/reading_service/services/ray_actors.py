"""Worker replicas in Ray actors: the classic strategy on a Ray cluster (``pipeloom[ray]``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..._validate import check_bool, check_callable, check_int, check_seconds
from ...datapipes import IterDataPipe
from ...datapipes.runtime import block_seed
from ...graph import Plan
from ..planning.planner import Settings, make_plan
from ..strategies.classic.runner import ClassicRunner
from ..strategies.in_process import InProcessRunner
from ..strategies.ray_actors.handle import Cluster, require_ray
from ..strategies.ray_actors.pool import STUCK_AFTER, ActorOptions, RayPool
from ..strategies.runner import Runner
from ..workers.rngs import workers_seed
from .base import PlannedService

__all__ = ["RayReadingService"]


class RayReadingService(PlannedService):
    """Run the sharded, per-item part of the pipeline in Ray actors, on one machine or many.

    The actors run what ``MultiProcessingReadingService``'s classic workers
    run: a copy of the pipeline up to the sharding point, which keeps the
    actor's shard, and the per-item blocks after it (with ``batch``/``collate``
    when the items map one-to-one). The main process merges their outputs by
    source position and runs the rest, so the output equals the in-process
    output for any ``num_actors``, and a checkpoint taken under Ray resumes
    under processes or threads and back.

    The actors start at the first epoch and live until ``shutdown()``. Each
    epoch is one streaming call per actor that yields runs of outputs
    (whole batches one per object), at most ``prefetch_factor`` of them waiting
    in the object store; NumPy arrays come back as zero-copy, read-only views
    of the object store when the actor runs on the same node. An actor that
    dies is restarted by Ray (``max_restarts`` times) and replays its epoch from
    the last output the main process received: nothing is lost or repeated.
    Once Ray restarts it no more, a ``WorkerError`` names the actor, its node
    and the cause, and the next epoch starts a fresh actor in its place. An
    actor still stuck in an item of an abandoned epoch (after a ``timeout``,
    Ctrl-C or a ``break``) when the next epoch starts is given at most 5 s
    (``timeout`` if less), then killed and replaced by a fresh actor.

    Args:
        num_actors: actors; 0 runs everything in the calling thread.
        num_cpus_per_actor: CPUs Ray reserves for each actor (fractions allowed).
        prefetch_factor: runs each actor may hold ahead of the consumer.
        ray_address: the cluster to connect to when Ray is not connected yet
            (None: ``RAY_ADDRESS``, else a local cluster, shared by the process's
            Ray services and stopped at the ``shutdown()`` of the last one using it).
        max_restarts: how many times Ray restarts each actor after it dies, over
            the actor's life (Ray's count: across epochs, resumes and
            re-iterations of the loader).
        worker_init_fn: called as ``worker_init_fn(actor_index)`` in each actor
            process before its first epoch, after its RNGs are seeded.
        timeout: seconds to wait for the next output before raising
            ``TimeoutError`` (None: as long as the actors live); an actor's
            restart counts too, so keep it well above a restart's time.
        start_timeout: seconds an actor may take to start (or restart) before
            the loader raises instead of waiting for resources that never free.
        in_order: merge by source position (True) or by arrival (False).
        ray_options: more ``ray.remote`` options for the actors (e.g.
            ``{"resources": {"preprocessing": 1}}`` or a ``scheduling_strategy``); not
            ``num_cpus``, ``max_restarts``, ``max_task_retries`` or
            ``concurrency_groups``, which the service sets itself.

    Raises:
        ImportError: when Ray is not installed (``pip install 'pipeloom[ray]'``).
        ValueError: for a bad argument, e.g. ``ray_options`` setting what the
            service sets itself.

    Example:
        >>> import ray  # doctest: +SKIP
        >>> ray.init(num_cpus=2)  # doctest: +SKIP
        >>> from pipeloom import DataLoader
        >>> from pipeloom.datapipes import IterableWrapper
        >>> pipe = IterableWrapper(range(6)).sharding_filter().map(lambda x: -x)
        >>> with DataLoader(pipe, RayReadingService(2), seed=0) as loader:  # doctest: +SKIP
        ...     list(loader)
        [0, -1, -2, -3, -4, -5]
    """

    def __init__(
        self,
        num_actors: int,
        *,
        num_cpus_per_actor: float = 1,
        prefetch_factor: int = 2,
        ray_address: str | None = None,
        max_restarts: int = 3,
        worker_init_fn: Callable[[int], None] | None = None,
        timeout: float | None = None,
        start_timeout: float = 60.0,
        in_order: bool = True,
        ray_options: dict[str, Any] | None = None,
    ) -> None:
        require_ray()
        check_int("num_actors", num_actors, minimum=0, hint="use 0 to load in the calling thread")
        _check_cpus(num_cpus_per_actor)
        check_int("prefetch_factor", prefetch_factor, minimum=1, hint="it counts runs per actor")
        check_int("max_restarts", max_restarts, minimum=0)
        check_callable("worker_init_fn", worker_init_fn, allow_none=True)
        check_seconds("timeout", timeout, allow_none=True)
        check_seconds("start_timeout", start_timeout, hint="e.g. 3600")
        check_bool("in_order", in_order)
        if ray_address is not None and not isinstance(ray_address, str):
            raise TypeError(f"ray_address must be a str or None, got {type(ray_address).__name__}")
        _check_ray_options(ray_options)
        self.num_actors = num_actors
        self.num_cpus_per_actor = num_cpus_per_actor
        self.prefetch_factor = prefetch_factor
        self.ray_address = ray_address
        self.max_restarts = max_restarts
        self.worker_init_fn = worker_init_fn
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.in_order = in_order
        self.ray_options = ray_options

    @property
    def delivers_in_arrival_order(self) -> bool:
        return not self.in_order

    def plan(self, pipeline: IterDataPipe) -> Plan:
        if self.num_actors == 0:
            return make_plan(pipeline, Settings("in-process", outer=self.outer))
        settings = Settings(
            "ray", workers=self.num_actors, prefetch=self.prefetch_factor, outer=self.outer
        )
        return make_plan(pipeline, settings)

    def make_runner(self, pipeline: IterDataPipe) -> Runner:
        plan = self.plan(pipeline)
        if self.num_actors == 0:
            return InProcessRunner(pipeline, plan)
        options = ActorOptions(
            num_cpus=self.num_cpus_per_actor,
            max_restarts=self.max_restarts,
            start_timeout=self.start_timeout,
            worker_init_fn=self.worker_init_fn,
            ray_options=self.ray_options,
            stuck_after=STUCK_AFTER if self.timeout is None else min(STUCK_AFTER, self.timeout),
        )
        pool = RayPool(
            plan,
            seed=workers_seed(block_seed(plan.part("workers").exit), plan.outer),  # type: ignore[arg-type]
            count=self.num_actors,
            prefetch=self.prefetch_factor,
            options=options,
            cluster=Cluster(self.ray_address),
        )
        return ClassicRunner(
            pipeline,
            plan,
            pool,
            in_order=self.in_order,
            timeout=self.timeout,
            start_method=None,
            prefetch=self.prefetch_factor,
        )

    def __repr__(self) -> str:
        return (
            f"RayReadingService(num_actors={self.num_actors}, "
            f"num_cpus_per_actor={self.num_cpus_per_actor}, "
            f"prefetch_factor={self.prefetch_factor}, max_restarts={self.max_restarts})"
        )


_OWN_OPTIONS = {
    "num_cpus": "num_cpus_per_actor",
    "max_restarts": "max_restarts",
    "max_task_retries": None,  # the service replays an epoch itself, from where it stopped
    "concurrency_groups": None,  # the service's control group answers beside an epoch
}
"""The ``ray.remote`` options the service sets itself: the argument to use instead, if any."""


def _check_cpus(value: Any) -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value >= 0):
        raise ValueError(
            f"num_cpus_per_actor must be a finite number of CPUs >= 0 (fractions allowed), "
            f"got {value!r}; e.g. 1, or 0.5 to fit two actors on a CPU"
        )


def _check_ray_options(options: Any) -> None:
    """Refuse what ``ray.remote`` would refuse only at the first epoch, as a clash of keywords."""
    if options is None:
        return
    if not isinstance(options, dict):
        raise TypeError(f"ray_options must be a dict or None, got {type(options).__name__}")
    for key, argument in _OWN_OPTIONS.items():
        if key in options:
            fix = (
                f"pass {argument}= to RayReadingService instead"
                if argument
                else "remove it: the service sets it for the epoch replay to work"
            )
            raise ValueError(
                f"ray_options may not set {key!r} (got {options[key]!r}): RayReadingService "
                f"sets it itself; {fix}"
            )
