"""A reading service's decisions for one pipeline, as one frozen, printable record.

A reading service's planner fills a :class:`Plan`; ``DataLoader.placement()``
returns it, ``print()`` shows it, ``to_dot()`` draws it. It is a
:class:`~pipeloom.graph.Placement` (which block runs where) plus the rest of
the decision: the strategy, the parts of the pipeline and how many copies of
each run, the sharding point, and the queues between the parts.

Example:
    >>> from pipeloom import DataLoader
    >>> from pipeloom.datapipes import IterableWrapper
    >>> from pipeloom.reading_service import ThreadReadingService
    >>> pipe = IterableWrapper(range(8)).sharding_filter().map(abs).shuffle()
    >>> with DataLoader(pipe, ThreadReadingService(2), seed=0) as loader:
    ...     print(loader.placement())  # doctest: +NORMALIZE_WHITESPACE +ELLIPSIS
    main thread: Shuffler(buffer_size=10000, seed=None)
    worker threads x2: Mapper(fn=abs) <- ShardingFilter(total=1, index=0) <- IterableWrapper(...)
    strategy: threads
    sharding point: ShardingFilter(total=1, index=0)
    queues: worker threads x2 -> main thread: 2 ThreadQueue(capacity=2) of (position, draws, item)
    positions go to the workers one at a time; their outputs are merged back in position order
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..datapipes import DataPipe
from ._graph import traverse
from ._placement import Placement

__all__ = ["Part", "Plan", "QueueLink"]


@dataclass(frozen=True)
class Part:
    """Blocks that run together in one place.

    Attributes:
        role: what the part is: ``"main"``, ``"workers"``, ``"item workers"``,
            ``"batch workers"`` or ``"separate process"``.
        location: where it runs, e.g. ``"worker processes x4"``.
        blocks: its blocks, in graph order (output first).
        exit: the block whose output leaves the part (None for the main part,
            whose output is the loader's).
        copies: how many replicas of the part run (one per worker).
    """

    role: str
    location: str
    blocks: tuple[DataPipe, ...]
    exit: DataPipe | None = None
    copies: int = 1


@dataclass(frozen=True)
class QueueLink:
    """The queues from one part to another.

    Attributes:
        source, target: the parts' locations.
        kind: the queue class (``"ThreadQueue"``, ``"ProcessQueue"``).
        count: how many such queues (e.g. one per worker).
        capacity: messages each holds.
        carries: what travels in them.
    """

    source: str
    target: str
    kind: str
    count: int
    capacity: int
    carries: str

    def __str__(self) -> str:
        return (
            f"{self.source} -> {self.target}: {self.count} {self.kind}(capacity="
            f"{self.capacity}) of {self.carries}"
        )


@dataclass(frozen=True)
class Plan(Placement):
    """Every placement decision a reading service made for one pipeline.

    Attributes:
        strategy: ``"in-process"``, ``"threads"``, ``"classic"``, ``"ray"``,
            ``"economic"`` or ``"chunked"``.
        parts: the parts of the pipeline, the main part first.
        sharding_point: the block where the work is split (None when nothing is).
        group_size: runs of consecutive positions that go to the same worker
            (a batch when workers build whole batches).
        unit: what the main process hands out (economic: a batch; chunked: a
            chunk) as ``(name, items in it, at most in flight)``; None for the
            other strategies.
        first_unit_chunk: chunked with whole batches: the first batch of an
            epoch goes out in chunks of this many items (to several workers, so
            it comes sooner) and the main process batches it; None otherwise.
        queues: the queues between the parts.
        rank: ``(rank, world size)`` under a distributed service, else None.
        outer: ``(total, index)``: this process keeps shard ``index`` of
            ``total`` at the sharding point (a rank's share); ``(1, 0)`` for all.
        notes: the planner's explanations, one line each (printed last).
    """

    strategy: str = "in-process"
    parts: tuple[Part, ...] = ()
    sharding_point: DataPipe | None = None
    group_size: int = 1
    unit: tuple[str, int, int] | None = None
    first_unit_chunk: int | None = None
    queues: tuple[QueueLink, ...] = ()
    rank: tuple[int, int] | None = None
    outer: tuple[int, int] = (1, 0)
    notes: tuple[str, ...] = ()

    @classmethod
    def from_parts(cls, output: DataPipe, parts: tuple[Part, ...], **details: Any) -> Plan:
        """A plan whose locations follow ``parts`` (a block in no part runs in the first)."""
        where = {id(block): part.location for part in parts for block in part.blocks}
        main = parts[0].location
        locations = tuple((block, where.get(id(block), main)) for block in traverse(output).nodes)
        return cls(output, locations, parts=parts, **details)

    def part(self, role: str) -> Part:
        """The (first) part with ``role``.

        Raises:
            KeyError: if the plan has no such part.
        """
        for part in self.parts:
            if part.role == role:
                return part
        raise KeyError(f"this {self.strategy} plan has no {role!r} part")

    def with_rank(self, rank: int, world_size: int) -> Plan:
        """This plan, as rank ``rank`` of ``world_size`` runs it (locations name the rank)."""
        prefix = f"rank {rank} of {world_size}, "
        parts = tuple(replace(part, location=prefix + part.location) for part in self.parts)
        queues = tuple(
            replace(link, source=prefix + link.source, target=prefix + link.target)
            for link in self.queues
        )
        locations = tuple((block, prefix + where) for block, where in self.locations)
        return replace(
            self, locations=locations, parts=parts, queues=queues, rank=(rank, world_size)
        )

    def __str__(self) -> str:
        lines = [super().__str__(), f"strategy: {self.strategy}"]
        if self.rank is not None:
            lines.append(f"rank: {self.rank[0]} of {self.rank[1]}")
        if self.sharding_point is not None:
            lines.append(f"sharding point: {self.sharding_point!r}")
        if self.unit is not None:
            name, size, in_flight = self.unit
            lines.append(f"unit: a {name} of {size} items, at most {in_flight} in flight")
        if self.first_unit_chunk is not None:
            lines.append(f"the first batch of an epoch: in chunks of {self.first_unit_chunk} items")
        lines.extend(
            f"{'queues: ' if i == 0 else '        '}{link}" for i, link in enumerate(self.queues)
        )
        lines.extend(self.notes)
        return "\n".join(lines)
