"""The pipeline as data: traverse, find, copy, replace, remove, draw; placement plans.

Reading services walk and edit pipelines through this API only, and describe
where each block runs with a :class:`Plan`.

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
from ._plan import Part, Plan, QueueLink

__all__ = [
    "Graph",
    "Part",
    "Placement",
    "Plan",
    "QueueLink",
    "copy",
    "find",
    "remove",
    "replace",
    "to_dot",
    "traverse",
    "upstream",
]
