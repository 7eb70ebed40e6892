"""``round_robin_demux``: deal a stream's items out to several streams in turn."""

from __future__ import annotations

import functools
from typing import Any

from ._base import IterDataPipe
from ._demux import demuxed

__all__ = ["round_robin_demux"]


def _turn(num_instances: int, numbered: tuple[int, Any]) -> int:
    return numbered[0] % num_instances


def _item(numbered: tuple[int, Any]) -> Any:
    return numbered[1]


def round_robin_demux(
    source: IterDataPipe, num_instances: int, buffer_size: int = 1000
) -> list[IterDataPipe]:
    """Item ``i`` goes to stream ``i % num_instances``.

    Built on ``demux``: items read for a stream other than the one asking wait
    in a buffer of ``buffer_size`` items (``-1``: unbounded). With
    ``num_instances=1`` the source itself is returned, in a list.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> first, second = IterableWrapper(range(5)).round_robin_demux(2)
        >>> list(first), list(second)
        ([0, 2, 4], [1, 3])
    """
    if isinstance(num_instances, bool) or not isinstance(num_instances, int) or num_instances < 1:
        raise ValueError(f"num_instances must be an int >= 1, got {num_instances!r}")
    if num_instances == 1:
        return [source]
    children = demuxed(
        "round_robin_demux",
        source.enumerate(),
        num_instances,
        functools.partial(_turn, num_instances),
        buffer_size=buffer_size,
    )
    return [child.map(_item) for child in children]
