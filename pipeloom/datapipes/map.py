"""torchdata 0.9's map-style class names, for ``import torchdata.datapipes as dp`` code.

Example:
    >>> import pipeloom.datapipes as dp
    >>> table = dp.map.SequenceWrapper([10, 20, 30])
    >>> dp.map.Mapper(table, lambda x: x + 1)[2]
    31
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ._base import MapDataPipe
from ._batch import MapBatcher
from ._concat import MapConcater
from ._unzip import unzip_map
from ._wrappers import SequenceWrapper
from ._zip import MapZipper

__all__ = [
    "Batcher",
    "Concater",
    "MapDataPipe",
    "Mapper",
    "SequenceWrapper",
    "Shuffler",
    "UnZipper",
    "Zipper",
]

Batcher = MapBatcher
Concater = MapConcater
Zipper = MapZipper
UnZipper = unzip_map


def Mapper(datapipe: MapDataPipe, fn: Callable[[Any], Any] | None = None) -> MapDataPipe:  # noqa: N802
    """torchdata's map-style ``Mapper`` (``fn`` defaults to the identity)."""
    return datapipe.map(fn)


def Shuffler(datapipe: MapDataPipe, *, indices: Sequence[Any] | None = None) -> Any:  # noqa: N802
    """torchdata's map-style ``Shuffler``: an ``IterDataPipe`` over the shuffled items."""
    return datapipe.shuffle(indices=indices)
