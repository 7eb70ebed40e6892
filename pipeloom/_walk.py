"""The one walk over a pipeline: every block once, each before the blocks it reads.

``pipeloom.graph`` is its public face (``traverse``, ``find``, ``replace``,
``copy``); ``pipeloom.datapipes`` uses it to restart, seed and checkpoint a
pipeline. It lives beside both because blocks need it to run themselves and
``datapipes`` sits below ``graph``. It follows each block's ``parents`` only
(never pickling, never ``gc`` referrers).

Example:
    >>> class Node:
    ...     def __init__(self, name, *parents):
    ...         self.name, self.parents = name, parents
    >>> a = Node("a"); b = Node("b", a); c = Node("c", a); d = Node("d", b, c)
    >>> [n.name for n in walk_upstream(d)]
    ['d', 'c', 'b', 'a']
"""

from __future__ import annotations

from typing import Any

__all__ = ["not_a_block", "walk_upstream"]


def walk_upstream(output: Any) -> list[Any]:
    """``output`` and everything it depends on, each block before its parents.

    Shared blocks (e.g. behind ``fork``) appear once. The order depends only
    on the pipeline's structure, so copies of a pipeline list their blocks in
    the same order (seeds and checkpoints are keyed by it).

    Raises:
        ValueError: if the blocks form a cycle.
    """
    postorder: list[Any] = []
    state: dict[int, int] = {}  # id -> 1 visiting, 2 done
    stack: list[tuple[Any, int]] = [(output, 0)]
    path: list[Any] = []
    while stack:
        block, next_parent = stack.pop()
        if next_parent == 0:
            if state.get(id(block)) == 2:
                continue
            state[id(block)] = 1
            path.append(block)
        parents = block.parents
        if next_parent < len(parents):
            stack.append((block, next_parent + 1))
            parent = parents[next_parent]
            mark = state.get(id(parent))
            if mark == 1:
                cycle = path[path.index(parent) :] + [parent]
                raise ValueError(
                    "the pipeline has a cycle: "
                    + " -> ".join(type(b).__name__ for b in reversed(cycle))
                    + "; a pipeline must be a DAG (use fork() to feed a block's output "
                    "to several consumers)"
                )
            if mark is None:
                stack.append((parent, 0))
        else:
            state[id(block)] = 2
            path.pop()
            postorder.append(block)
    postorder.reverse()
    return postorder


def not_a_block(value: Any) -> TypeError:
    """The error for a value given where a pipeline was expected."""
    return TypeError(
        f"expected a pipeline (an IterDataPipe or MapDataPipe), got "
        f"{type(value).__name__}; wrap plain iterables with IterableWrapper(...)"
    )
