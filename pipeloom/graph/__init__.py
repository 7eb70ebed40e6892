"""The pipeline as data: traverse, find, replace, remove, draw.

Reading services plan placement through this API only.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> from pipeloom import graph
    >>> pipe = IterableWrapper(range(8)).sharding_filter().map(abs)
    >>> [type(b).__name__ for b in graph.find(pipe, lambda b: b.is_shardable())]
    ['ShardingFilter']
"""

from ._dot import to_dot
from ._graph import Graph, copy, find, remove, replace, traverse, upstream
from ._placement import Placement

__all__ = [
    "Graph",
    "Placement",
    "copy",
    "find",
    "remove",
    "replace",
    "to_dot",
    "traverse",
    "upstream",
]
