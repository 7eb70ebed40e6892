"""What a reading service is: a plan for where the blocks run, and an epoch runner."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any

from ..datapipes import IterDataPipe
from ..graph import Placement

__all__ = ["ReadingService"]


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

    @abc.abstractmethod
    def placement(self) -> Placement:
        """Which block runs where."""

    def state_dict(self) -> dict[str, Any]:
        """State of the running epoch, enough for ``start_epoch(epoch, state)`` to resume."""
        raise NotImplementedError(f"{type(self).__name__} cannot save a mid-epoch state yet")

    def shutdown(self) -> None:  # noqa: B027 - optional hook, nothing to stop by default
        """Stop every thread and process the service started; idempotent."""

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
