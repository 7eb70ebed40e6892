"""Which shard each copy of the sharding point keeps.

Worker ``index`` of ``workers``, in a process that keeps outer shard
``outer = (R, r)`` (e.g. rank ``r`` of ``R``), keeps shard ``index * R + r``
of ``R * workers``: the process's share is shard ``r`` of ``R`` whatever its
number of workers, and positions go out in runs of ``group_size``.
"""

from __future__ import annotations

from ...datapipes import DataPipe
from ...datapipes.runtime import note_shard
from ...graph import upstream

__all__ = ["find_in_copy", "index_in_part", "keep_shard"]


def keep_shard(
    point: DataPipe,
    *,
    workers: int = 1,
    index: int = 0,
    group_size: int = 1,
    outer: tuple[int, int] = (1, 0),
) -> None:
    """Tell ``point`` (a sharding point) which shard is worker ``index``'s (module docstring).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> point = IterableWrapper(range(12)).sharding_filter()
        >>> keep_shard(point, workers=2, index=1, group_size=2, outer=(3, 0))
        >>> list(point)
        [6, 7]
    """
    outer_total, outer_index = outer
    total, kept = outer_total * workers, index * outer_total + outer_index
    point.sharding_settings(total, kept)
    note_shard(point, total, kept)  # e.g. a snapshot: its writers see all only if total is theirs
    if group_size != 1:
        point.set_shard_group_size(group_size)


def index_in_part(part_exit: DataPipe, block: DataPipe) -> int:
    """The place of ``block`` among the blocks ``part_exit`` depends on (stable across copies)."""
    for i, candidate in enumerate(upstream(part_exit)):
        if candidate is block:
            return i
    raise ValueError(f"{block!r} is not upstream of {part_exit!r}")


def find_in_copy(copy_exit: DataPipe, index: int) -> DataPipe:
    """The block at ``index`` (see :func:`index_in_part`) in a copy of the part."""
    return upstream(copy_exit)[index]
