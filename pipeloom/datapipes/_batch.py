"""``batch`` / ``unbatch``: group consecutive items into lists, and back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._validate import check_bool, check_int
from ..errors import NotAvailable
from ._base import IterDataPipe, MapDataPipe
from ._context import NO_STAMP, current_stamp, restore_stamp, stamp_output
from ._map import fn_name
from ._runs import RunReader
from ._state_fields import StateFields

__all__ = ["Batcher", "MapBatcher", "Unbatcher"]


class Batcher(IterDataPipe):
    """Group consecutive items into batches of ``batch_size`` (functional name: ``batch``).

    Args:
        source: the upstream block.
        batch_size: items per batch; the last batch may be shorter.
        drop_last: drop the last batch when it is shorter than ``batch_size``.
        wrapper_class: applied to each batch (a ``list``).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper(range(5)).batch(2))
        [[0, 1], [2, 3], [4]]
        >>> list(IterableWrapper(range(5)).batch(2, drop_last=True))
        [[0, 1], [2, 3]]
    """

    inputs = ("source",)

    def __init__(
        self,
        source: IterDataPipe,
        batch_size: int,
        drop_last: bool = False,
        wrapper_class: Callable[[list], Any] = list,
    ) -> None:
        check_batch_args("batch", batch_size, drop_last, wrapper_class)
        self.source = source
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.wrapper_class = wrapper_class
        self._wrap = None if wrapper_class is list else wrapper_class
        self._batch: list[Any] = []
        self._first_stamp: tuple = (None, 0, None, 0)
        self._reader: RunReader | None = None

    def batches_of(self) -> int:
        """Each batch is a run of ``batch_size`` consecutive items (a placement trait)."""
        return self.batch_size

    def reset(self) -> None:
        self._batch = []
        self._reader = None

    def async_next(self) -> Any:
        batch = self._batch
        size = self.batch_size
        reader = self._reader
        if reader is None:  # per-item blocks upstream run fused, a run per call
            reader = self._reader = RunReader(self.source)
        try:
            if not batch:
                batch.append(self.source.async_next())  # the blocks one by one: a run of 1
                self._first_stamp = current_stamp()
            while len(batch) < size:  # NotAvailable keeps the partial batch
                reader.extend(batch, size - len(batch))
        except StopIteration:
            if not batch or self.drop_last:
                batch.clear()
                raise
        self._batch = []
        # A batch carries its first item's stamp, so item_rng() on the batch
        # does not depend on items pulled (and dropped) after it.
        restore_stamp(self._first_stamp)
        wrap = self._wrap
        return batch if wrap is None else wrap(batch)

    def __len__(self) -> int:
        return batch_count(len(self.source), self.batch_size, self.drop_last)

    def state_dict(self) -> dict[str, Any]:
        if not self._batch:  # between batches: nothing held (as at an epoch's start)
            return {"batch": []}
        return {"batch": list(self._batch), "first_stamp": self._first_stamp}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_reader"] = None  # found again where the copy runs
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        batch = fields.list("batch")
        if len(batch) >= self.batch_size:
            fields.fail("batch", f"a partial batch of fewer than {self.batch_size} items", batch)
        # a partial batch needs its first item's stamp (the batch's key): no default then
        self._first_stamp = fields.stamp("first_stamp") if batch else NO_STAMP
        self._batch = batch

    def __repr__(self) -> str:
        return f"Batcher({batch_args(self)})"


class MapBatcher(MapDataPipe):
    """Index ``i`` is the batch ``[i*batch_size, (i+1)*batch_size)`` (functional: ``batch``).

    ``async_get`` requests every item of the batch before it waits on any, so
    an asynchronous source can fetch them concurrently.

    Example:
        >>> from pipeloom.datapipes import SequenceWrapper
        >>> dp = SequenceWrapper(range(5)).batch(2)
        >>> dp[2], len(dp)
        ([4], 3)
    """

    inputs = ("source",)

    def __init__(
        self,
        source: MapDataPipe,
        batch_size: int,
        drop_last: bool = False,
        wrapper_class: Callable[[list], Any] = list,
    ) -> None:
        check_batch_args("batch", batch_size, drop_last, wrapper_class)
        self.source = source
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.wrapper_class = wrapper_class
        self._wrap = None if wrapper_class is list else wrapper_class
        self._partial: dict[int, list[Any]] = {}  # batch index -> slots (_MISSING until ready)

    def async_get(self, index: int) -> Any:
        length = len(self)
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"MapBatcher indices are ints, got {type(index).__name__} {index!r}")
        if index < 0:
            index += length
        if not 0 <= index < length:
            raise IndexError(f"batch index {index} is out of range for {length} batches")
        start = index * self.batch_size
        stop = min(start + self.batch_size, len(self.source))
        slots = self._partial.pop(index, None)
        if slots is None:
            slots = [_MISSING] * (stop - start)
        get, missing = self.source.async_get, False
        for offset, value in enumerate(slots):
            if value is _MISSING:
                try:
                    slots[offset] = get(start + offset)
                except NotAvailable:
                    missing = True  # requested; go on requesting the rest
        if missing:
            self._partial[index] = slots
            raise NotAvailable
        wrap = self._wrap
        return slots if wrap is None else wrap(slots)

    def __len__(self) -> int:
        return batch_count(len(self.source), self.batch_size, self.drop_last)

    def reset(self) -> None:
        self._partial = {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_partial"] = {}
        return state

    def __repr__(self) -> str:
        return f"MapBatcher({batch_args(self)})"


class Unbatcher(IterDataPipe):
    """Yield the elements of each batch (functional name: ``unbatch``).

    Args:
        source: the upstream block.
        unbatch_level: how many levels of nesting to flatten. ``1`` flattens
            each batch (a list or tuple); ``k`` flattens ``k`` levels; ``0``
            yields the items unchanged; ``-1`` flattens every nested ``list``
            (as in torchdata, tuples are kept whole there: they are usually
            samples such as ``(image, label)``).

    Raises (while iterating):
        IndexError: an element at a level to flatten is not a list or tuple.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper([[0, 1], [2]]).unbatch())
        [0, 1, 2]
        >>> list(IterableWrapper([[[0, 1], [2]], [[3]]]).unbatch(unbatch_level=-1))
        [0, 1, 2, 3]
    """

    inputs = ("source",)
    per_item = True

    def __init__(self, source: IterDataPipe, unbatch_level: int = 1) -> None:
        check_int(
            "unbatch_level",
            unbatch_level,
            minimum=-1,
            hint="use 1 to flatten one level, k for k levels, -1 for all nested lists, 0 for none",
        )
        self.source = source
        self.unbatch_level = unbatch_level
        self._buffer: list[Any] | tuple[Any, ...] = ()
        self._index = 0
        self._offset = 0  # the output index of self._buffer[0] (after a resume: > 0)
        self._stamp: tuple = (None, 0, None, 0)  # the batch's

    def reset(self) -> None:
        self._buffer, self._index, self._offset = (), 0, 0

    def async_next(self) -> Any:
        buffer, index = self._buffer, self._index
        while index >= len(buffer):
            batch = self.source.async_next()  # NotAvailable: nothing pulled, nothing lost
            buffer, index = self._flatten(batch), 0
            self._buffer, self._offset, self._stamp = buffer, 0, current_stamp()
        self._index = index + 1
        # Element j of the batch keyed k is keyed (*k, j): its own item_rng() draws.
        stamp_output(self._stamp, self._offset + index)  # type: ignore[arg-type]
        return buffer[index]

    def _flatten(self, batch: Any) -> list[Any] | tuple[Any, ...]:
        level = self.unbatch_level
        if level == 1 and (type(batch) is list or type(batch) is tuple):
            return batch
        if level == 0:
            return (batch,)
        out: list[Any] = []
        if level == -1:
            _flatten_lists(batch, out)
        else:
            _flatten_levels(batch, level, level, out)
        return out

    def state_dict(self) -> dict[str, Any]:
        pending = list(self._buffer[self._index :])
        if not pending:
            return {"pending": pending}
        return {"pending": pending, "stamp": self._stamp, "output": self._offset + self._index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        self._buffer, self._index = fields.list("pending"), 0
        # pending items need their batch's stamp and index (their keys): no defaults then
        pending = bool(self._buffer)
        self._stamp = fields.stamp("stamp") if pending else NO_STAMP
        self._offset = fields.int("output") if pending else 0

    def __repr__(self) -> str:
        return f"Unbatcher(unbatch_level={self.unbatch_level})"


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def _flatten_lists(value: Any, out: list[Any]) -> None:
    if isinstance(value, list):
        for element in value:
            _flatten_lists(element, out)
    else:
        out.append(value)


def _flatten_levels(value: Any, level: int, requested: int, out: list[Any]) -> None:
    if not isinstance(value, (list, tuple)):
        depth = requested - level + 1
        raise IndexError(
            f"unbatch_level={requested} exceeds the depth of the data: at level {depth} "
            f"found {type(value).__name__} {_short(value)}, expected a list or tuple; "
            f"use a smaller unbatch_level (or -1 to flatten whatever lists there are)"
        )
    if level == 1:
        out.extend(value)
        return
    for element in value:
        _flatten_levels(element, level - 1, requested, out)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def batch_args(block: Any) -> str:
    text = f"batch_size={block.batch_size}, drop_last={block.drop_last}"
    if block.wrapper_class is not list:
        text += f", wrapper_class={fn_name(block.wrapper_class)}"
    return text


def batch_count(length: int, batch_size: int, drop_last: bool) -> int:
    """How many batches ``length`` items make."""
    return length // batch_size if drop_last else -(-length // batch_size)


def check_batch_args(
    owner: str, batch_size: Any, drop_last: Any, wrapper_class: Any = list
) -> None:
    """Validate the arguments shared by the batching blocks."""
    check_int(
        "batch_size", batch_size, minimum=1, hint="use batch_size=1 to yield single-item batches"
    )
    check_bool("drop_last", drop_last)
    if not callable(wrapper_class):
        raise TypeError(
            f"{owner}() expects wrapper_class to be a callable taking a list (e.g. list "
            f"or tuple), got {type(wrapper_class).__name__} {wrapper_class!r}"
        )
