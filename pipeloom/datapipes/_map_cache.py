"""``in_memory_cache`` for map-style blocks: keep each item once it was read."""

from __future__ import annotations

from typing import Any

from ._base import MapDataPipe

__all__ = ["MapInMemoryCacheHolder"]


class MapInMemoryCacheHolder(MapDataPipe):
    """Read item ``i`` from the source once, then from memory (functional: ``in_memory_cache``).

    Every item read is kept, keyed by its index, for the life of the block
    (torchdata's map-style cache: there is no size bound, so use it for
    datasets that fit in memory). Under a reading service each worker keeps
    the items it read; worker processes keep them between epochs only with
    ``persistent_workers=True``.

    Example:
        >>> from pipeloom.datapipes import SequenceWrapper
        >>> calls = []
        >>> cached = SequenceWrapper([5, 6]).map(lambda x: calls.append(x) or x).in_memory_cache()
        >>> cached[1], cached[1], calls
        (6, 6, [6])
    """

    inputs = ("source",)

    def __init__(self, source: MapDataPipe) -> None:
        self.source = source
        self._cache: dict[Any, Any] = {}

    def async_get(self, index: Any) -> Any:
        cache = self._cache
        try:
            return cache[index]
        except KeyError:
            item = cache[index] = self.source.async_get(index)  # NotAvailable propagates
            return item
        except TypeError:  # an unhashable key: read through
            return self.source.async_get(index)

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {}  # the cache is an optimisation: a resumed run reads items again

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_cache"] = {}  # a copy sent to a worker starts empty
        return state

    def __repr__(self) -> str:
        return f"MapInMemoryCacheHolder(cached={len(self._cache)})"
