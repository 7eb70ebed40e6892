"""What a reading service is, and the thin facade the built-in services share.

A reading service plans where the blocks run and runs the epochs. The
built-in services (:class:`PlannedService`) validate their arguments, ask the
planner for one :class:`~pipeloom.graph.Plan` at ``initialize`` and hand it to
the runner of their strategy (``strategies/``); every other method is one
call on that runner.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from typing import Any

from ...datapipes import IterDataPipe
from ...graph import Placement, Plan
from ..strategies.runner import Runner

__all__ = ["PlannedService", "ReadingService"]


class ReadingService(abc.ABC):
    """Runs a pipeline's epochs somewhere: the calling thread, threads, processes, ranks.

    Lifecycle (driven by ``DataLoader``)::

        initialize(pipeline) --> start_epoch(epoch, state) --> ... --> shutdown()
                                  ^__________ next epoch _________|

    A service works on the pipeline only through ``pipeloom.graph``.
    """

    @abc.abstractmethod
    def initialize(self, pipeline: IterDataPipe) -> None:
        """Plan placement for ``pipeline`` (seeded already); called once."""

    @abc.abstractmethod
    def start_epoch(self, epoch: int, state: dict[str, Any] | None = None) -> Iterator[Any]:
        """Start an epoch (resuming from ``state`` if given); return its items."""

    def check(self, pipeline: IterDataPipe) -> None:  # noqa: B027 - optional hook
        """Raise now what :meth:`initialize` would raise about ``pipeline``; start nothing.

        ``DataLoader`` calls it when it is built, so a pipeline the service
        cannot run (no sharding point, a filter before an economic batch) is
        refused on the line that builds the loader, not at its first ``iter()``.
        """

    @abc.abstractmethod
    def placement(self) -> Placement:
        """Which block runs where (the built-in services return their :class:`Plan`)."""

    def state_dict(self) -> dict[str, Any]:
        """State of the running epoch, enough for ``start_epoch(epoch, state)`` to resume."""
        raise NotImplementedError(f"{type(self).__name__} cannot save a mid-epoch state yet")

    def shutdown(self) -> None:  # noqa: B027 - optional hook, nothing to stop by default
        """Stop every thread and process the service started; idempotent."""

    def queues(self) -> Sequence[tuple[str, Any]]:
        """The queues the running epoch uses, as ``(label, DataLoaderQueue)`` pairs.

        ``loader.stats()`` samples their occupancy; a service without queues
        (in-process, or one that moves data another way) returns none.
        """
        return ()

    @property
    def delivers_in_arrival_order(self) -> bool:
        """True when outputs come as the workers finish them (``in_order=False``).

        Their order then differs from run to run, so a resume cannot re-read
        the epoch and drop the outputs delivered before the checkpoint: the
        dropped ones would be others. ``DataLoader`` refuses such a replay.
        """
        return False

    def agree_seed(self, seed: int) -> int:
        """The seed every participant uses; ``DataLoader`` calls it before seeding.

        One process needs no agreement (the default returns ``seed``); a
        distributed service returns rank 0's seed on every rank.
        """
        return seed

    def set_outer_sharding(self, total: int, index: int) -> None:
        """Run only outer shard ``index`` of ``total`` (e.g. this rank's); before ``initialize``.

        Workers then split that shard further: with ``n`` workers, worker ``i``
        keeps shard ``i * total + index`` of ``total * n``, so the service's
        items are those of shard ``index`` of ``total`` whatever ``n``.
        """
        raise TypeError(
            f"{type(self).__name__} cannot run one shard of a sharded pipeline; use "
            f"InProcessReadingService, ThreadReadingService or MultiProcessingReadingService "
            f"inside a DistributedReadingService"
        )


class PlannedService(ReadingService):
    """A service that plans once and delegates each epoch to the runner it chose.

    Subclasses implement :meth:`plan` (plan the pipeline with ``self.outer``,
    this process's share) and :meth:`make_runner` (plan it and build the runner).
    """

    _runner: Runner | None = None
    outer: tuple[int, int] = (1, 0)

    @abc.abstractmethod
    def plan(self, pipeline: IterDataPipe) -> Plan:
        """Where each block of ``pipeline`` would run; raises if the service cannot run it."""

    @abc.abstractmethod
    def make_runner(self, pipeline: IterDataPipe) -> Runner:
        """Plan ``pipeline`` and build the runner for it."""

    def check(self, pipeline: IterDataPipe) -> None:
        self.plan(pipeline)

    def set_outer_sharding(self, total: int, index: int) -> None:
        self.outer = (total, index)

    def initialize(self, pipeline: IterDataPipe) -> None:
        if not isinstance(pipeline, IterDataPipe):
            raise TypeError(f"expected an IterDataPipe, got {type(pipeline).__name__}")
        self._runner = self.make_runner(pipeline)

    def start_epoch(self, epoch: int, state: dict[str, Any] | None = None) -> Iterator[Any]:
        return self._require_runner().start_epoch(epoch, state)

    def state_dict(self) -> dict[str, Any]:
        return self._require_runner().state_dict()

    def placement(self) -> Plan:
        return self._require_runner().plan

    def shutdown(self) -> None:
        if self._runner is not None:
            self._runner.shutdown()

    def queues(self) -> Sequence[tuple[str, Any]]:
        return () if self._runner is None else self._runner.queues()

    def _require_runner(self) -> Runner:
        if self._runner is None:
            raise RuntimeError(f"{type(self).__name__} used before initialize(pipeline)")
        return self._runner
