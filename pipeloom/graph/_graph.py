"""The pipeline as data: nodes, edges, search and rewrites.

Walks blocks only through their inputs (``block.parents``): the declared
``inputs``, or for a block that declares none, its block-valued attributes.

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

import copy as _copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from .._walk import not_a_block, walk_upstream
from ..datapipes import DataPipe

__all__ = ["Graph", "copy", "find", "remove", "replace", "traverse", "upstream"]

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
        return upstream(block)


def upstream(output: DataPipe) -> list[DataPipe]:
    """``output`` and every block it depends on, each before its inputs (``traverse().nodes``).

    Raises:
        TypeError: if ``output`` is not a block.
        ValueError: if the pipeline has a cycle.
    """
    if not isinstance(output, DataPipe):
        raise not_a_block(output)
    return walk_upstream(output)


def traverse(output: DataPipe) -> Graph:
    """Snapshot the graph ending at ``output``.

    Raises:
        TypeError: if ``output`` is not a block.
        ValueError: if the pipeline has a cycle.
    """
    nodes = upstream(output)
    index = {id(node): i for i, node in enumerate(nodes)}
    edges = tuple((index[id(parent)], i) for i, node in enumerate(nodes) for parent in node.parents)
    return Graph(tuple(nodes), edges)


def find(output: DataPipe, match: type[B] | Callable[[DataPipe], bool]) -> list[B]:
    """Blocks of a type (subclasses included), or for which ``match(block)`` is true.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> from pipeloom.datapipes import Mapper
        >>> len(find(IterableWrapper([1]).map(str).map(len), Mapper))
        2
    """
    if isinstance(match, type):
        kind = match
        return [n for n in upstream(output) if isinstance(n, kind)]  # type: ignore[misc]
    if callable(match):
        return [n for n in upstream(output) if match(n)]  # type: ignore[misc]
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


def copy(
    output: B, *, replace: Mapping[DataPipe, DataPipe] | None = None, share: Iterable[object] = ()
) -> B:
    """A deep copy of the pipeline ending at ``output``, ``replace[old]`` standing for ``old``.

    The replacements are used as they are, not copied, and the blocks only
    they depended on are left out. Copies start fresh: ``lazy_init`` runs
    again where a copy runs. Use it to give each worker its own part, or to
    cut a pipeline where another part takes over. The objects in ``share``
    (data the blocks only read, e.g. a large list; see
    ``pipeloom.datapipes.runtime.read_only_data``) are referred to, not copied.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> source = IterableWrapper([1, 2]); pipe = source.map(str)
        >>> other = IterableWrapper([3])
        >>> twin = copy(pipe, replace={source: other})
        >>> list(twin), twin is pipe, twin.source is other
        (['3'], False, True)

    Raises:
        ValueError: if a block to replace is not part of the pipeline.
    """
    replace = dict(replace or {})
    if replace:
        present = {id(block) for block in upstream(output)}
        for old in replace:
            if id(old) not in present:
                raise ValueError(f"{old!r} is not part of the pipeline ending at {output!r}")
        if output in replace:
            return replace[output]  # type: ignore[return-value]
    # deepcopy's memo maps an object's id to its copy: seeded with the
    # replacements, every reference to ``old`` becomes ``new``.
    memo: dict[int, object] = {id(old): new for old, new in replace.items()}
    shared = list(share)
    memo.update((id(data), data) for data in shared)  # read-only data: the copy refers to it
    memo[id(memo)] = [*replace, *shared]  # keep the originals alive while the ids are in use
    try:
        return _copy.deepcopy(output, memo)
    except TypeError as error:  # a live object (lock, socket, open file) in a block
        raise _uncopyable(output, replace, error) from error


def _uncopyable(output: DataPipe, replace: Mapping[DataPipe, DataPipe], error: Exception) -> Any:
    """The error naming the block and the attribute that ``copy`` could not copy."""
    for block in upstream(output):
        if block in replace:
            continue
        state = block.__getstate__()
        for name, value in state.items() if isinstance(state, dict) else ():
            if isinstance(value, DataPipe):
                continue  # an input: checked as a block of its own
            try:
                _copy.deepcopy(value)
            except TypeError as cause:
                return TypeError(
                    f"{block!r} cannot be copied, and a reading service gives each worker "
                    f"(and the main process) its own copy of the pipeline: its attribute "
                    f"{name!r} holds a {type(value).__name__} ({cause}). Create such an "
                    f"object in lazy_init(), which runs again where each copy runs, or "
                    f"leave it out of __getstate__()"
                )
    return error


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
