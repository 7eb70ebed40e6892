"""Reading a source by position: shards without a full pass, resumes in O(1).

A source whose items are a sequence it only reads (a ``list``, ``tuple``,
``range``, 1-D or n-D NumPy array, :class:`CompactStringList`, a file
listing) can hand out the item at any position. The sharding point above it
then reads only its own shard's positions instead of filtering a full pass,
and a resume starts at the saved position directly. Positions stay the global
positions, so order, ``item_rng()`` and checkpoints do not change.

Shard ``index`` of ``total`` keeps position ``p`` when
``(p // group) % total == index`` (runs of ``group`` positions per shard).

Example:
    >>> first_kept(5, total=3, index=1, group=2)
    8
    >>> kept_span(0, 10, total=3, index=1, group=1, count=9)
    range(1, 10, 3)
    >>> list(read_span([10, 11, 12, 13], range(1, 4, 2)))
    [11, 13]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ._compact import CompactStringList

__all__ = ["first_kept", "is_positioned", "kept_span", "read_span"]

_SLICEABLE = (list, tuple, range)
_POSITIONED = (*_SLICEABLE, CompactStringList, np.ndarray)


def is_positioned(items: Any) -> bool:
    """True for a container whose iteration is exactly ``items[0], items[1], ...``.

    Only exact built-in and pipeloom types qualify (a subclass may iterate
    differently); reading them runs no user code. NumPy arrays need ``ndim >= 1``.
    """
    kind = type(items)
    if kind is np.ndarray:
        return items.ndim >= 1
    return kind in _POSITIONED


def first_kept(position: int, *, total: int, index: int, group: int) -> int:
    """The first position ``>= position`` that shard ``index`` of ``total`` keeps."""
    if total == 1:
        return position
    group_number = position // group
    ahead = (index - group_number) % total
    return position if ahead == 0 else (group_number + ahead) * group


def kept_span(
    position: int, length: int, *, total: int, index: int, group: int, count: int
) -> range | None:
    """Up to ``count`` next kept positions from ``position`` as one ``range``; None past the end.

    The range is contiguous within one run of ``group`` positions, or strided by
    ``total`` when ``group`` is 1.
    """
    start = first_kept(position, total=total, index=index, group=group)
    if start >= length:
        return None
    if total == 1:
        return range(start, min(length, start + count))
    if group == 1:
        return range(start, min(length, start + (count - 1) * total + 1), total)
    return range(start, min(length, start + count, (start // group + 1) * group))


def read_span(items: Sequence[Any], span: range) -> Iterable[Any]:
    """The items at the positions of ``span``, in order.

    Built-in sequences are sliced at once (no user code runs); other
    sequences are read lazily, one item per step of the iteration, so an
    error surfaces at its item and nothing after it is read.
    """
    kind = type(items)
    if kind in _SLICEABLE or kind is np.ndarray:
        return items[span.start : span.stop : span.step]
    return map(items.__getitem__, span)
