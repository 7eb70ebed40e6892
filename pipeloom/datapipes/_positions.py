"""Where the positions of a block's items come from: the *position authority*.

Items are stamped with a position by the sharding root (a shardable block
with no shardable block upstream) or, when there is none, by their source.
Caches use the authority to replay stored items under the right stamps: its
live stamps give the epoch's seed, and in a worker it tells which positions
are this worker's (it keeps its shard and skips what a resume skips).

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> pipe = IterableWrapper(range(4)).sharding_filter().map(str)
    >>> type(position_authority(pipe)).__name__
    'ShardingFilter'
    >>> type(position_authority(IterableWrapper(range(4)).map(str))).__name__
    'IterableWrapper'
"""

from __future__ import annotations

from ._base import DataPipe, IterDataPipe
from ._pipeline import upstream_blocks

__all__ = ["authority_index", "position_authority", "sharded_upstream"]


def sharded_upstream(block: DataPipe) -> bool:
    """True when a shardable block is upstream of ``block`` (itself excluded)."""
    return any(b.is_shardable() for b in upstream_blocks(block)[1:])


def authority_index(block: DataPipe) -> int | None:
    """The index in ``upstream_blocks(block)`` of :func:`position_authority`, or None."""
    blocks = upstream_blocks(block)
    shardable = [i for i, b in enumerate(blocks) if i and b.is_shardable()]
    roots = [
        i for i in shardable if not any(b.is_shardable() for b in upstream_blocks(blocks[i])[1:])
    ]
    if shardable:
        return roots[0] if len(roots) == 1 else None
    sources = [
        i
        for i, b in enumerate(blocks)
        if i
        and isinstance(b, IterDataPipe)
        and not any(isinstance(p, IterDataPipe) for p in b.parents)
    ]
    return sources[0] if len(sources) == 1 else None


def position_authority(block: DataPipe) -> IterDataPipe | None:
    """The block that stamps the positions of the items ``block`` receives, if it is unique.

    The sharding root upstream, if there is exactly one; else the only
    iterable source upstream; None when neither is unique.
    """
    index = authority_index(block)
    if index is None:
        return None
    found = upstream_blocks(block)[index]
    assert isinstance(found, IterDataPipe)
    return found
