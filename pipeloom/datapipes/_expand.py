"""The shared base of blocks that turn each item into a list of outputs.

``list_files`` (a root into its files), ``shard_expand`` (a brace pattern
into shard names) and ``repeat`` (an item into copies of it) each compute,
for one input, the complete list of its outputs. :class:`Expander` does the
rest once: it hands the outputs out one by one, gives output ``j`` of an
input keyed ``k`` the key ``(*k, j)`` (the workers' merge sees the input's
position, and each output has its own ``item_rng()`` draws), and saves the
outputs not yet handed out in a checkpoint.
"""

from __future__ import annotations

from typing import Any

from ._base import IterDataPipe
from ._context import NO_STAMP, current_stamp, stamp_output
from ._state_fields import StateFields

__all__ = ["Expander"]


class Expander(IterDataPipe):
    """Yield, for each input item, the outputs of ``self._expand(item)`` in order.

    Subclasses implement ``_expand(item) -> list`` (it may raise to reject an
    item). Outputs not yet handed out are part of the state, so they must be
    picklable.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> class Twice(Expander):
        ...     def _expand(self, item):
        ...         return [item, item]
        >>> list(Twice(IterableWrapper("ab")))
        ['a', 'a', 'b', 'b']
    """

    inputs = ("source",)
    per_item = True  # each input expands on its own: runs in workers

    def __init__(self, source: IterDataPipe) -> None:
        self.source = source
        self._pending: list[Any] = []
        self._next = 0
        self._offset = 0  # the output index of self._pending[0] (after a resume: > 0)
        self._stamp: tuple = (None, 0, None, 0)

    def _expand(self, item: Any) -> list[Any]:
        raise NotImplementedError

    def reset(self) -> None:
        self._pending, self._next, self._offset = [], 0, 0

    def async_next(self) -> Any:
        while self._next >= len(self._pending):
            item = self.source.async_next()  # NotAvailable here loses nothing
            stamp = current_stamp()
            self._pending, self._next, self._stamp = self._expand(item), 0, stamp
            self._offset = 0
        index = self._next
        self._next = index + 1
        stamp_output(self._stamp, self._offset + index)  # type: ignore[arg-type]
        return self._pending[index]

    def state_dict(self) -> dict[str, Any]:
        return {
            "pending": self._pending[self._next :],
            "stamp": self._stamp,
            "output": self._offset + self._next,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        self._pending, self._next = fields.list("pending"), 0
        # pending outputs need their input's stamp and index (their keys): no defaults then
        pending = bool(self._pending)
        self._stamp = fields.stamp("stamp") if pending else NO_STAMP
        self._offset = fields.int("output") if pending else 0

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_pending"], state["_next"] = self._pending[self._next :], 0
        state["_offset"] = self._offset + self._next
        return state
