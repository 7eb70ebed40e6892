"""Sources every rank of a job reads whole: those not behind its sharding point.

A pipeline has one sharding point; under ``DistributedReadingService`` it
splits what is upstream of it among the ranks. A source that joins the
stream after it -- a corpus mixed in with ``mux`` after the workers, the
second input of a ``zip`` -- is read from its start by every rank: each of
``n`` ranks delivers all of its items, the same ones at the same steps, so
that corpus is seen ``n`` times an epoch. When that is not meant, the mix
belongs before the sharding point; :func:`warn_replicated_sources` says so.
When it is meant (a side input such as a constant stream zipped in), the
source, or a block of its branch before the join, says so with the mark
``read_by_every_rank = True`` (on the block, or on its class), which keeps
it out of the warning.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> web = IterableWrapper(range(4)).sharding_filter()
    >>> [repr(s) for s in replicated_sources(web.mux(IterableWrapper(range(2))))]
    ['IterableWrapper(range(0, 2))']
    >>> side = IterableWrapper(range(2))
    >>> side.read_by_every_rank = True  # meant: every rank reads it whole
    >>> replicated_sources(web.zip(side))
    []
"""

from __future__ import annotations

import warnings

from ...datapipes import DataPipe
from ...graph import upstream
from ..planning.cut import find_sharding_point

__all__ = ["replicated_sources", "warn_replicated_sources"]


def replicated_sources(pipeline: DataPipe) -> list[DataPipe]:
    """The sources of ``pipeline`` its sharding point does not read (none without one).

    Sources upstream of a block marked ``read_by_every_rank = True`` (the
    source itself, or a block of its branch before it joins the sharded
    stream) are meant to be read whole by every rank: left out.
    """
    with warnings.catch_warnings():  # the planner warns about the pipeline itself
        warnings.simplefilter("ignore")
        try:
            point = find_sharding_point(pipeline)
        except ValueError:
            return []
    behind = {id(block) for block in upstream(point)}
    for marked in upstream(pipeline):
        if getattr(marked, "read_by_every_rank", False) is True:
            branch = {id(block) for block in upstream(marked)}
            if id(point) not in branch:  # a side branch, not the sharded stream
                behind |= branch
    return [
        block
        for block in upstream(pipeline)
        if id(block) not in behind and len(upstream(block)) == 1
    ]


def warn_replicated_sources(pipeline: DataPipe, world_size: int) -> None:
    """Warn that each source after the sharding point is read whole by all ``world_size`` ranks."""
    for source in replicated_sources(pipeline):
        warnings.warn(
            f"{source!r} joins the stream after the sharding point, so each of the "
            f"{world_size} ranks reads all of it: its items are delivered {world_size} "
            f"times an epoch, the same ones at the same steps on every rank (a corpus mixed "
            f"in with mux() is over-sampled {world_size}x). Put it before sharding_filter() "
            f"(mix the sources first, then shard); if every rank should read it whole, "
            f"silence this with warnings.filterwarnings('ignore', 'joins the stream after "
            f"the sharding point'), or mark that source: read_by_every_rank = True",
            UserWarning,
            stacklevel=4,
        )
