"""Compose reading services: an outer one (ranks) around an inner one (workers)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ...datapipes import IterDataPipe
from ...graph import Placement
from .base import ReadingService

__all__ = ["SequentialReadingService"]


class SequentialReadingService(ReadingService):
    """Run ``services`` nested, the first outermost: each splits the work further.

    Every service but the last must be able to wrap the next one (today:
    ``DistributedReadingService``). With ``w`` ranks and ``n`` workers the data
    is cut into ``w * n`` shards: worker ``i`` of rank ``r`` keeps shard
    ``r * n + i``, and each rank merges its workers' shards in source order.

    Example:
        >>> from pipeloom.reading_service import (
        ...     DistributedReadingService, MultiProcessingReadingService)
        >>> SequentialReadingService(DistributedReadingService(), MultiProcessingReadingService(4))
        ... # doctest: +ELLIPSIS
        SequentialReadingService(DistributedReadingService(...), MultiProcessingReadingService(...))
    """

    def __init__(self, *services: ReadingService) -> None:
        if not services:
            raise ValueError(
                "SequentialReadingService needs at least one service, got none; e.g. "
                "SequentialReadingService(DistributedReadingService(), "
                "MultiProcessingReadingService(4))"
            )
        for position, service in enumerate(services):
            if not isinstance(service, ReadingService):
                raise TypeError(
                    f"service {position} must be a ReadingService, got {type(service).__name__}"
                )
        for position, outer in enumerate(services[:-1]):
            if not callable(getattr(outer, "wrap", None)):
                raise ValueError(
                    f"service {position} ({outer!r}) cannot run another service inside it; only "
                    f"the last service may be an InProcess/Thread/MultiProcessing service, e.g. "
                    f"SequentialReadingService(DistributedReadingService(), "
                    f"MultiProcessingReadingService(4))"
                )
        runner = services[-1]
        for outer in reversed(services[:-1]):
            outer.wrap(runner)  # type: ignore[attr-defined]
            runner = outer
        self.services = services
        self._top = runner

    @property
    def delivers_in_arrival_order(self) -> bool:
        return self._top.delivers_in_arrival_order

    def agree_seed(self, seed: int) -> int:
        return self._top.agree_seed(seed)

    def set_outer_sharding(self, total: int, index: int) -> None:
        self._top.set_outer_sharding(total, index)

    def initialize(self, pipeline: IterDataPipe) -> None:
        self._top.initialize(pipeline)

    def start_epoch(self, epoch: int, state: dict[str, Any] | None = None) -> Iterator[Any]:
        return self._top.start_epoch(epoch, state)

    def state_dict(self) -> dict[str, Any]:
        return self._top.state_dict()

    def placement(self) -> Placement:
        return self._top.placement()

    def shutdown(self) -> None:
        self._top.shutdown()

    def queues(self) -> Sequence[tuple[str, Any]]:
        return self._top.queues()

    def __repr__(self) -> str:
        return f"SequentialReadingService({', '.join(repr(s) for s in self.services)})"
