"""``concat_then_split``: the stream of sequences as one, cut into fixed-length rows."""

from __future__ import annotations

from typing import Any

from ._base import IterDataPipe
from ._context import current_stamp, restore_stamp
from ._held import HeldShare, HoldsItems, share_of
from ._sequences import (
    PadValue,
    check_pad_value,
    item_length,
    pack_segments,
    piece_stamp,
    saved_lengths,
    slice_item,
)
from ._state_fields import StateFields

__all__ = ["ConcatSplitter"]


class ConcatSplitter(IterDataPipe, HoldsItems):
    """Concatenate sequences and cut rows of ``max_length`` (functional: ``concat_then_split``).

    No padding except in the last row: each row is filled with the next
    ``max_length`` tokens of the stream, and the rest of a sequence cut at a
    row's end begins the next row. Rows have the form ``pack`` gives them: a
    sequence row is ``(values, segment_ids, positions)``, a dict row the packed
    fields plus ``"segment_ids"`` and ``"positions"``; a sequence's part in a
    row is one segment, and positions restart at 0 in each row (a model's
    position range stays ``max_length``). Attend across segments for plain
    causal LM training, or within them (e.g. block-diagonal masks) to keep
    documents apart.

    The state holds the sequences not yet fully emitted, as they came, and how
    far into the first one the next row starts. On a resume on another number
    of ranks each new rank takes its share of the old ranks' sequences
    (``HoldsItems``), each partly emitted one from where its next row starts.

    Args:
        source: the sequences (see ``pack`` for the forms accepted).
        max_length: tokens per row.
        pad_value: padding of the last row, or a dict of field -> padding.
        drop_remainder: drop the last row when it is not full.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> rows = list(IterableWrapper([[1, 2, 3], [4, 5], [6, 7, 8]]).concat_then_split(3))
        >>> [values.tolist() for values, _, _ in rows]
        [[1, 2, 3], [4, 5, 6], [7, 8, 0]]
        >>> [segments.tolist() for _, segments, _ in rows]
        [[1, 1, 1], [1, 1, 2], [1, 1, 0]]
    """

    inputs = ("source",)

    def __init__(
        self,
        source: IterDataPipe,
        max_length: int,
        *,
        pad_value: PadValue = 0,
        drop_remainder: bool = False,
    ) -> None:
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(
                f"concat_then_split() expects max_length to be an int >= 1, got {max_length!r}"
            )
        check_pad_value("concat_then_split", pad_value)
        if not isinstance(drop_remainder, bool):
            raise TypeError(
                f"concat_then_split() expects drop_remainder to be True or False, "
                f"got {drop_remainder!r}"
            )
        self.source = source
        self.max_length = max_length
        self.pad_value = pad_value
        self.drop_remainder = drop_remainder
        self.reset()

    def reset(self) -> None:
        self._pending: list[Any] = []  # sequences not yet fully emitted
        self._lengths: list[int] = []
        self._stamps: list[tuple] = []
        self._offset = 0  # tokens of the first pending sequence already emitted
        self._done = False

    def async_next(self) -> Any:
        limit = self.max_length
        while not self._done and sum(self._lengths) - self._offset < limit:
            try:
                item = self.source.async_next()  # NotAvailable: what was read stays pending
            except StopIteration:
                self._done = True
                break
            size = item_length(item, "concat_then_split")
            if size:
                self._pending.append(item)
                self._lengths.append(size)
                self._stamps.append(current_stamp())
        available = sum(self._lengths) - self._offset
        if available == 0 or (available < limit and self.drop_remainder):
            self.reset()
            self._done = True
            raise StopIteration
        restore_stamp(piece_stamp(self._stamps[0], self._offset))
        return pack_segments(self._take(limit), limit, self.pad_value, "concat_then_split")

    def _take(self, limit: int) -> list[tuple[Any, int, int]]:
        segments, taken = [], 0
        while taken < limit and self._pending:
            item, size, start = self._pending[0], self._lengths[0], self._offset
            stop = min(size, start + limit - taken)
            segments.append((item, start, stop))
            taken += stop - start
            if stop == size:
                del self._pending[0], self._lengths[0], self._stamps[0]
                self._offset = 0
            else:
                self._offset = stop
        return segments

    def state_dict(self) -> dict[str, Any]:
        return {
            "pending": list(self._pending),
            "stamps": list(self._stamps),
            "offset": self._offset,
            "done": self._done,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        pending = fields.list("pending")
        lengths = saved_lengths(fields, "pending", pending, "concat_then_split")
        self._stamps = fields.stamps("stamps", length=len(pending))
        self._offset = fields.int("offset", maximum=lengths[0] - 1 if lengths else 0)
        self._pending, self._lengths = pending, lengths
        self._done = fields.bool("done")

    def load_held_states(
        self, states: list[dict[str, Any]], share: HeldShare | None = None
    ) -> None:
        """This rank's share of the old ranks' sequences not yet emitted, in rank order
        (see ``HoldsItems``)."""
        held: list[tuple[Any, tuple]] = []
        for state in states:
            self.load_state_dict(state)  # checks the fields
            items, marks, offset = list(self._pending), list(self._stamps), self._offset
            if items and offset:  # the rest of a sequence cut at a row's end
                size = item_length(items[0], "concat_then_split")
                items[0] = slice_item(items[0], offset, size)
                marks[0] = piece_stamp(marks[0], offset)
            held += zip(items, marks)
        mine = share_of(share, held)
        pending, stamps = [item for item, _ in mine], [stamp for _, stamp in mine]
        self.load_state_dict({"pending": pending, "stamps": stamps, "offset": 0, "done": False})

    def __repr__(self) -> str:
        return f"ConcatSplitter(max_length={self.max_length}, drop_remainder={self.drop_remainder})"
