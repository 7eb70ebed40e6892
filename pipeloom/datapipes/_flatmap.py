"""``flatmap``: map each item to an iterable and yield its elements."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ._base import IterDataPipe
from ._context import current_stamp, stamp_output
from ._map import Col, fn_name, make_reader, raise_with_note
from ._state_fields import StateFields

__all__ = ["FlatMapper"]


def _identity(item: Any) -> Any:
    return item


class FlatMapper(IterDataPipe):
    """Yield the elements of ``fn(item)`` for each item (functional name: ``flatmap``).

    Args:
        source: the upstream block.
        fn: returns an iterable for each item (or for ``item[input_col]``, as
            in :class:`Mapper`). ``None``: each item is itself iterable.
        input_col: the column(s) passed to ``fn``.

    Every element carries the stamp (``current_position()``) of the item it came
    from. A checkpoint taken in the middle of an item stores that item's
    remaining elements, so they must be picklable.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper([1, 2, 3]).flatmap(lambda x: [x] * x))
        [1, 2, 2, 3, 3, 3]
    """

    inputs = ("source",)
    per_item = True

    def __init__(
        self, source: IterDataPipe, fn: Callable[[Any], Any] | None = None, input_col: Col = None
    ) -> None:
        self.source = source
        self.fn = fn
        self.input_col = input_col
        self._expand = make_reader(_identity if fn is None else fn, input_col, "flatmap", "fn")
        self._elements: Iterator[Any] | None = None
        self._stamp: tuple = (None, 0, None, 0)
        self._output = 0  # the index, among its input's elements, of the next element

    def reset(self) -> None:
        self._elements = None

    def async_next(self) -> Any:
        while True:
            elements = self._elements
            if elements is not None:
                try:
                    value = next(elements)
                except StopIteration:
                    self._elements = None
                except Exception as error:
                    self._elements = None
                    raise_with_note(error, self, self._stamp[2])
                else:
                    output = self._output
                    self._output = output + 1
                    stamp_output(self._stamp, output)  # type: ignore[arg-type]
                    return value
            item = self.source.async_next()  # NotAvailable here loses nothing
            stamp = self._stamp = current_stamp()
            self._output = 0
            try:
                self._elements = iter(self._expand(item))
            except Exception as error:
                raise_with_note(error, self, stamp[2])

    def state_dict(self) -> dict[str, Any]:
        if self._elements is None:
            return {}
        remaining = list(self._elements)
        self._elements = iter(remaining)
        return {"remaining": remaining, "stamp": self._stamp, "output": self._output}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        if "remaining" in state or "stamp" in state:  # in the middle of an item's elements
            remaining = fields.list("remaining")
            self._stamp = fields.stamp("stamp")
            self._output = fields.int("output")
            self._elements = iter(remaining)
        else:
            self._elements = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if state.get("_elements") is not None:  # a generator cannot be pickled
            remaining = list(self._elements)  # type: ignore[arg-type]
            self._elements = iter(remaining)
            state["_elements"] = iter(remaining)
        return state

    def __repr__(self) -> str:
        name = None if self.fn is None else fn_name(self.fn)
        col = "" if self.input_col is None else f", input_col={self.input_col!r}"
        return f"FlatMapper(fn={name}{col})"
