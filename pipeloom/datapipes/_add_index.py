"""``add_index``: number dict items in a field of their own."""

from __future__ import annotations

import copy
from collections.abc import MutableMapping
from typing import Any

from ._base import IterDataPipe

__all__ = ["IndexAdder"]


class IndexAdder(IterDataPipe):
    """Set ``item[index_name] = i`` on the ``i``-th dict item (functional: ``add_index``).

    The item is copied, not changed in place (torchdata 0.9 wrote into the
    upstream's dict). Numbering starts at 0 each epoch.

    Args:
        source: a block yielding dicts (rows, or batches as column dicts).
        index_name: the key to store the index under.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper([{"a": 1}, {"c": 3}]).add_index("order"))
        [{'a': 1, 'order': 0}, {'c': 3, 'order': 1}]
    """

    inputs = ("source",)
    one_to_one = True

    def __init__(self, source: IterDataPipe, index_name: str = "index") -> None:
        try:
            hash(index_name)
        except TypeError:
            raise TypeError(f"index_name must be a dict key, got {index_name!r}") from None
        self.source = source
        self.index_name = index_name
        self._index = 0

    def reset(self) -> None:
        self._index = 0

    def async_next(self) -> Any:
        item = self.source.async_next()
        if not isinstance(item, MutableMapping):
            raise TypeError(
                f"add_index() numbers dict items, got {type(item).__name__} {item!r:.60}; for "
                f"other items use enumerate(), which yields (index, item)"
            )
        index = self._index
        self._index = index + 1
        numbered = copy.copy(item)
        numbered[self.index_name] = index
        return numbered

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {"index": self._index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._index = int(state["index"])

    def __repr__(self) -> str:
        return f"IndexAdder(index_name={self.index_name!r})"
