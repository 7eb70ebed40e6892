"""``unzip``: one stream of sequences into one stream per position."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from ._base import IterDataPipe, MapDataPipe
from ._fork import forked

__all__ = ["unzip", "unzip_map"]


def _column(position: int, length: int, item: Any) -> Any:
    if len(item) != length:
        raise ValueError(
            f"unzip(sequence_length={length}) got an item of length {len(item)}: "
            f"{item!r:.60}; every item must have sequence_length elements"
        )
    return item[position]


def _positions(sequence_length: Any, columns_to_skip: Sequence[int] | None) -> list[int]:
    if (
        isinstance(sequence_length, bool)
        or not isinstance(sequence_length, int)
        or sequence_length < 1
    ):
        raise ValueError(f"sequence_length must be an int >= 1, got {sequence_length!r}")
    skip = set(columns_to_skip or ())
    bad = [
        c
        for c in skip
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < sequence_length
    ]
    if bad:
        raise ValueError(
            f"columns_to_skip must hold positions in [0, {sequence_length}), got "
            f"{sorted(bad, key=str)}"
        )
    kept = [position for position in range(sequence_length) if position not in skip]
    if not kept:
        raise ValueError(
            f"columns_to_skip={sorted(skip)} skips every one of the {sequence_length} columns; "
            f"keep at least one"
        )
    return kept


def unzip(
    source: IterDataPipe,
    sequence_length: int,
    buffer_size: int = 1000,
    columns_to_skip: Sequence[int] | None = None,
) -> list[IterDataPipe]:
    """Split a stream of sequences into one stream per kept position.

    Built on ``fork``: a child reading ahead of another holds the items in
    between in a buffer of ``buffer_size`` (``-1``: unbounded).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> numbers, letters = IterableWrapper([(0, "a"), (1, "b")]).unzip(sequence_length=2)
        >>> list(numbers), list(letters)
        ([0, 1], ['a', 'b'])
    """
    kept = _positions(sequence_length, columns_to_skip)
    children = forked("unzip", source, len(kept), buffer_size)
    return [
        child.map(functools.partial(_column, position, sequence_length))
        for child, position in zip(children, kept)
    ]


def unzip_map(
    source: MapDataPipe, sequence_length: int, columns_to_skip: Sequence[int] | None = None
) -> list[MapDataPipe]:
    """Split a map-style block of sequences into one map-style block per kept position.

    Example:
        >>> from pipeloom.datapipes import SequenceWrapper
        >>> numbers, letters = SequenceWrapper([(0, "a"), (1, "b")]).unzip(sequence_length=2)
        >>> numbers[1], letters[1]
        (1, 'b')
    """
    kept = _positions(sequence_length, columns_to_skip)
    return [source.map(functools.partial(_column, position, sequence_length)) for position in kept]
