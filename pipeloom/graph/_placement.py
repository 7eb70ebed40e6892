"""Placement as data: which block runs where, produced by a reading service."""

from __future__ import annotations

from dataclasses import dataclass

from ..datapipes import DataPipe
from ._dot import to_dot
from ._graph import traverse

__all__ = ["Placement"]


@dataclass(frozen=True)
class Placement:
    """Where each block of a pipeline runs.

    Attributes:
        output: the pipeline's last block.
        locations: ``(block, location)`` for every block, in graph order
            (output first). A location is a short label such as
            ``"main thread"`` or ``"process workers x4 (sharded)"``.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> dp = IterableWrapper([1]).map(str)
        >>> print(Placement.uniform(dp, "main thread"))
        main thread: Mapper(fn=str) <- IterableWrapper([1])
    """

    output: DataPipe
    locations: tuple[tuple[DataPipe, str], ...]

    @classmethod
    def uniform(cls, output: DataPipe, location: str) -> Placement:
        """Every block in one place."""
        return cls(output, tuple((block, location) for block in traverse(output).nodes))

    def where(self, block: DataPipe) -> str:
        """The location of ``block``."""
        for candidate, location in self.locations:
            if candidate is block:
                return location
        raise ValueError(f"{block!r} is not part of this placement")

    def by_block_id(self) -> dict[int, str]:
        """``{id(block): location}``, the form ``to_dot`` takes."""
        return {id(block): location for block, location in self.locations}

    def to_dot(self) -> str:
        """DOT source with one cluster per location (see ``pipeloom.graph.to_dot``)."""
        return to_dot(self.output, self)

    def __str__(self) -> str:
        groups: dict[str, list[str]] = {}
        for block, location in self.locations:
            groups.setdefault(location, []).append(repr(block))
        return "\n".join(f"{where}: {' <- '.join(blocks)}" for where, blocks in groups.items())
