"""The pipeline as data: nodes, edges, search and rewrites.

Walks blocks only through their declared inputs (``block.parents``).

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> from pipeloom.graph import traverse
    >>> g = traverse(IterableWrapper(range(4)).map(str).batch(2))
    >>> [type(n).__name__ for n in g.nodes]
    ['Batcher', 'Mapper', 'IterableWrapper']
    >>> g.edges
    ((1, 0), (2, 1))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..datapipes import DataPipe, upstream_blocks

__all__ = ["Graph", "find", "remove", "replace", "traverse"]

B = TypeVar("B", bound=DataPipe)


@dataclass(frozen=True)
class Graph:
    """A snapshot of a pipeline's structure.

    Attributes:
        nodes: every block, the output first, each block before its parents.
        edges: ``(parent index, consumer index)`` pairs into ``nodes``, one per input.
    """

    nodes: tuple[DataPipe, ...]
    edges: tuple[tuple[int, int], ...]

    @property
    def output(self) -> DataPipe:
        return self.nodes[0]

    def index(self, block: DataPipe) -> int:
        """Position of ``block`` in ``nodes``."""
        for i, node in enumerate(self.nodes):
            if node is block:
                return i
        raise ValueError(f"{block!r} is not part of this pipeline")

    def consumers(self, block: DataPipe) -> list[DataPipe]:
        """The blocks that take ``block`` as an input."""
        i = self.index(block)
        return _unique(self.nodes[c] for p, c in self.edges if p == i)

    def sources(self) -> list[DataPipe]:
        """The blocks with no inputs."""
        return [node for node in self.nodes if not node.parents]

    def upstream(self, block: DataPipe) -> list[DataPipe]:
        """``block`` and every block it depends on."""
        self.index(block)
        return upstream_blocks(block)


def traverse(output: DataPipe) -> Graph:
    """Snapshot the graph ending at ``output``.

    Raises:
        TypeError: if ``output`` is not a block.
        ValueError: if the pipeline has a cycle.
    """
    nodes = upstream_blocks(output)
    index = {id(node): i for i, node in enumerate(nodes)}
    edges = tuple((index[id(parent)], i) for i, node in enumerate(nodes) for parent in node.parents)
    return Graph(tuple(nodes), edges)


def find(output: DataPipe, match: type[B] | Callable[[DataPipe], bool]) -> list[B]:
    """Blocks of a type (subclasses included), or for which ``match(block)`` is true.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> from pipeloom.datapipes._map import Mapper
        >>> len(find(IterableWrapper([1]).map(str).map(len), Mapper))
        2
    """
    if isinstance(match, type):
        kind = match
        return [n for n in upstream_blocks(output) if isinstance(n, kind)]  # type: ignore[misc]
    if callable(match):
        return [n for n in upstream_blocks(output) if match(n)]  # type: ignore[misc]
    raise TypeError(
        f"find() expects a block class or a predicate function, got {type(match).__name__}"
    )


def replace(output: DataPipe, old: DataPipe, new: DataPipe) -> DataPipe:
    """Put ``new`` where ``old`` is: every consumer of ``old`` now reads ``new``.

    ``new`` brings its own inputs (it may take ``old``'s parents). Returns the
    pipeline's output, which is ``new`` when ``old`` was the output.

    Raises:
        ValueError: if ``old`` is not in the pipeline, or the result has a cycle
            (the pipeline is then left unchanged).
    """
    if not isinstance(new, DataPipe):
        raise TypeError(f"replace() needs a block as the replacement, got {type(new).__name__}")
    graph = traverse(output)
    graph.index(old)
    if old is output:
        traverse(new)
        return new
    consumers = graph.consumers(old)
    for consumer in consumers:
        consumer.replace_parent(old, new)
    try:
        traverse(output)
    except ValueError:
        for consumer in consumers:
            consumer.replace_parent(new, old)
        raise
    return output


def remove(output: DataPipe, block: DataPipe) -> DataPipe:
    """Take out ``block``, which must have exactly one input; its consumers read that input.

    Returns the pipeline's output (``block``'s input when ``block`` was the output).
    """
    parents = block.parents
    if len(parents) != 1:
        raise ValueError(
            f"remove() can only take out a block with exactly one input, but {block!r} "
            f"has {len(parents)}; use replace() to rewire blocks with several inputs"
        )
    return replace(output, block, parents[0])


def _unique(blocks) -> list[DataPipe]:
    seen: set[int] = set()
    out = []
    for block in blocks:
        if id(block) not in seen:
            seen.add(id(block))
            out.append(block)
    return out
