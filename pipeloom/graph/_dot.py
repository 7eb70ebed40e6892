"""Render a pipeline as Graphviz DOT text, grouped by placement."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..datapipes import DataPipe
from ._graph import traverse

if TYPE_CHECKING:
    from ._placement import Placement

__all__ = ["to_dot"]


def to_dot(output: DataPipe, placement: Mapping[int, str] | Placement | None = None) -> str:
    """DOT source for the pipeline; render with ``dot -Tpng``.

    Args:
        output: the pipeline's last block.
        placement: where blocks run: a ``Placement``/``Plan`` (what
            ``DataLoader.placement()`` returns), or ``{id(block): "where"}``.
            Blocks are drawn in one cluster per location; for a ``Plan`` the
            sharding point is drawn bold and an edge between two locations
            names the queue that carries it.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> print(to_dot(IterableWrapper([1]).map(str)))  # doctest: +NORMALIZE_WHITESPACE
        digraph pipeline {
          rankdir=LR;
          node [shape=box, fontname="Helvetica"];
          n1 [label="IterableWrapper([1])"];
          n0 [label="Mapper(fn=str)"];
          n1 -> n0;
        }
    """
    graph = traverse(output)
    where: Mapping[int, str] = {}
    bold: set[int] = set()
    queue_between: dict[tuple[str, str], str] = {}
    if placement is not None and not isinstance(placement, Mapping):
        where = placement.by_block_id()
        point = getattr(placement, "sharding_point", None)
        bold = {id(point)} if point is not None else set()
        for link in getattr(placement, "queues", ()):
            queue_between[link.source, link.target] = link.kind
    elif placement:
        where = placement
    lines = ["digraph pipeline {", "  rankdir=LR;", '  node [shape=box, fontname="Helvetica"];']
    order = list(reversed(range(len(graph.nodes))))  # sources first reads naturally
    if where:
        groups: dict[str, list[int]] = {}
        for i in order:
            groups.setdefault(where.get(id(graph.nodes[i]), "unplaced"), []).append(i)
        for number, (location, members) in enumerate(groups.items()):
            lines.append(f"  subgraph cluster_{number} {{")
            lines.append(f'    label="{_escape(location)}";')
            lines.extend(f"    {_node_line(i, graph.nodes[i], bold)}" for i in members)
            lines.append("  }")
    else:
        lines.extend(f"  {_node_line(i, graph.nodes[i], bold)}" for i in order)
    for p, c in graph.edges:
        source = where.get(id(graph.nodes[p]), "")
        target = where.get(id(graph.nodes[c]), "")
        queue = queue_between.get((source, target))
        lines.append(f'  n{p} -> n{c} [label="{queue}"];' if queue else f"  n{p} -> n{c};")
    lines.append("}")
    return "\n".join(lines)


def _node_line(index: int, block: DataPipe, bold: set[int]) -> str:
    style = ", penwidth=2" if id(block) in bold else ""
    return f'n{index} [label="{_escape(repr(block))}"{style}];'


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
