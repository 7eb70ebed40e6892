"""Render a pipeline as Graphviz DOT text, grouped by placement."""

from __future__ import annotations

from collections.abc import Mapping

from ..datapipes import DataPipe
from ._graph import traverse

__all__ = ["to_dot"]


def to_dot(output: DataPipe, placement: Mapping[int, str] | None = None) -> str:
    """DOT source for the pipeline; render with ``dot -Tpng``.

    Args:
        output: the pipeline's last block.
        placement: optional ``{id(block): "where it runs"}``; blocks are drawn
            in one cluster per location (see ``Placement.by_block_id``).

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
    lines = ["digraph pipeline {", "  rankdir=LR;", '  node [shape=box, fontname="Helvetica"];']
    order = list(reversed(range(len(graph.nodes))))  # sources first reads naturally
    if placement:
        groups: dict[str, list[int]] = {}
        for i in order:
            groups.setdefault(placement.get(id(graph.nodes[i]), "unplaced"), []).append(i)
        for number, (where, members) in enumerate(groups.items()):
            lines.append(f"  subgraph cluster_{number} {{")
            lines.append(f'    label="{_escape(where)}";')
            lines.extend(f"    {_node_line(i, graph.nodes[i])}" for i in members)
            lines.append("  }")
    else:
        lines.extend(f"  {_node_line(i, graph.nodes[i])}" for i in order)
    lines.extend(f"  n{p} -> n{c};" for p, c in graph.edges)
    lines.append("}")
    return "\n".join(lines)


def _node_line(index: int, block: DataPipe) -> str:
    return f'n{index} [label="{_escape(repr(block))}"];'


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
