"""``pack``: variable-length sequences packed into fixed-length rows."""

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

__all__ = ["Packer"]

STRATEGIES = ("first_fit", "best_fit")
OVERSIZED = ("split", "truncate", "error")


class Packer(IterDataPipe, HoldsItems):
    """Pack sequences into rows of ``max_length`` tokens (functional name: ``pack``).

    Up to ``buffer_size`` rows ("bins") are open at once. Each sequence goes,
    whole, into an open bin with room for it: the first one opened
    (``"first_fit"``) or the one it fills most tightly (``"best_fit"``, the
    default: less padding). A bin that becomes exactly full is emitted at once.
    When no open bin has room and ``buffer_size`` bins are open, the fullest bin
    is emitted (the earliest opened on ties) and a new one opened; at the end of
    the stream the open bins are emitted in the order they were opened. The
    result depends only on the input order: the same under every reading
    service. Empty sequences carry no tokens and are dropped.

    An item is a sequence (a tensor or array, packed along its first dimension,
    or a list of numbers), and a row is ``(values, segment_ids, positions)``;
    or a dict such as ``{"input_ids": ..., "labels": ...}`` whose sequence
    fields have one length, and a row is the dict of packed fields plus
    ``"segment_ids"`` (1, 2, ... for the sequences in the row, 0 on padding)
    and ``"positions"`` (0, 1, ... within each sequence); other values (e.g. a
    source name) become the list of the row's values. All are torch tensors of
    ``max_length`` rows; fields keep their dtype.

    A sequence longer than ``max_length`` is, by ``oversized``:

    * ``"split"`` (default): cut into full rows of ``max_length`` (emitted at
      once, each one segment whose positions restart at 0), the rest packed as
      a sequence of its own. Nothing is lost; the pieces after the first see no
      context from before the cut. Each piece is an output of its own for
      ``item_rng()``: the piece from token ``t > 0`` has key ``(key, t)``.
    * ``"truncate"``: cut to ``max_length``; the rest is dropped.
    * ``"error"``: a ``ValueError`` naming its length (for data where a cut
      sequence is wrong, e.g. a supervised example: filter long ones first).

    Args:
        source: the sequences.
        max_length: tokens per row.
        strategy: ``"best_fit"`` or ``"first_fit"``.
        buffer_size: how many bins may be open; more bins, less padding.
        pad_value: the padding, or a dict of field -> padding (0 where unnamed),
            e.g. ``{"input_ids": 0, "labels": -100}``.
        oversized: ``"split"``, ``"truncate"`` or ``"error"`` (see above).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> rows = list(IterableWrapper([[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]).pack(4))
        >>> [values.tolist() for values, _, _ in rows]
        [[1, 2, 3, 6], [7, 8, 9, 10], [4, 5, 0, 0]]
        >>> rows[0][1].tolist(), rows[0][2].tolist()  # segment ids, positions
        ([1, 1, 1, 2], [0, 1, 2, 0])
    """

    inputs = ("source",)

    def __init__(
        self,
        source: IterDataPipe,
        max_length: int,
        strategy: str = "best_fit",
        buffer_size: int = 32,
        *,
        pad_value: PadValue = 0,
        oversized: str = "split",
    ) -> None:
        for name, value in (("max_length", max_length), ("buffer_size", buffer_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"pack() expects {name} to be an int >= 1, got {value!r}")
        if strategy not in STRATEGIES:
            raise ValueError(
                f"pack() strategy must be 'best_fit' (less padding) or 'first_fit', "
                f"got {strategy!r}"
            )
        if oversized not in OVERSIZED:
            raise ValueError(
                f"pack() oversized must be 'split', 'truncate' or 'error', got {oversized!r}"
            )
        check_pad_value("pack", pad_value)
        self.source = source
        self.max_length = max_length
        self.strategy = strategy
        self.buffer_size = buffer_size
        self.pad_value = pad_value
        self.oversized = oversized
        self.reset()

    def reset(self) -> None:
        self._bins: list[list[Any]] = []  # open bins: their items, as they came
        self._free: list[int] = []  # room left in each open bin
        self._stamps: list[tuple] = []  # each open bin's first item's stamp
        self._ready: list[tuple[list[Any], tuple]] = []  # closed bins, to emit in order
        self._done = False

    def async_next(self) -> Any:
        while not self._ready:
            if self._done:
                raise StopIteration
            try:
                item = self.source.async_next()  # NotAvailable: nothing pulled, nothing lost
            except StopIteration:
                self._done = True
                self._ready.extend(zip(self._bins, self._stamps))
                self._bins, self._free, self._stamps = [], [], []
                continue
            self._place(item, current_stamp())
        items, stamp = self._ready.pop(0)
        restore_stamp(stamp)
        segments = [(item, 0, item_length(item, "pack")) for item in items]
        return pack_segments(segments, self.max_length, self.pad_value, "pack")

    def _place(self, item: Any, stamp: tuple) -> None:
        size, limit = item_length(item, "pack"), self.max_length
        if size > limit:
            item, size, stamp = self._cut(item, size, stamp)
        if size == 0:
            return
        if size == limit:
            self._ready.append(([item], stamp))
            return
        free = self._free
        fits = [i for i, room in enumerate(free) if room >= size]
        if fits:
            chosen = fits[0] if self.strategy == "first_fit" else min(fits, key=free.__getitem__)
            self._bins[chosen].append(item)
            free[chosen] -= size
            if free[chosen] == 0:
                self._close(chosen)
            return
        while len(free) >= self.buffer_size:  # more bins: a larger buffer's state (strict=False)
            self._close_fullest()
        self._bins.append([item])
        free.append(limit - size)
        self._stamps.append(stamp)

    def _cut(self, item: Any, size: int, stamp: tuple) -> tuple[Any, int, tuple]:
        """Truncate or split ``item``: the part left to pack, its length and its stamp.

        Each piece of a split sequence is an output of its own: the piece
        starting at token ``t > 0`` has key ``(key, t)``, so ``item_rng()``
        draws afresh for it, as for ``flatmap``'s outputs.
        """
        limit = self.max_length
        if self.oversized == "error":
            raise ValueError(
                f"pack() got a sequence of length {size} > max_length={limit}; pass "
                f"oversized='split' (cut it into rows) or 'truncate', or filter long "
                f"sequences out before packing"
            )
        if self.oversized == "truncate":
            return slice_item(item, 0, limit), limit, stamp
        whole = size - size % limit
        for start in range(0, whole, limit):
            piece = slice_item(item, start, start + limit)
            self._ready.append(([piece], piece_stamp(stamp, start)))
        return slice_item(item, whole, size), size - whole, piece_stamp(stamp, whole)

    def _close_fullest(self) -> None:
        """Close the fullest open bin (the earliest opened on ties)."""
        self._close(min(range(len(self._free)), key=self._free.__getitem__))

    def _close(self, index: int) -> None:
        self._ready.append((self._bins.pop(index), self._stamps.pop(index)))
        self._free.pop(index)

    def state_dict(self) -> dict[str, Any]:
        return {
            "bins": [list(items) for items in self._bins],
            "free": list(self._free),
            "stamps": list(self._stamps),
            "ready": [(list(items), stamp) for items, stamp in self._ready],
            "done": self._done,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields, limit = StateFields(self, state), self.max_length
        bins = fields.list("bins")
        for items in bins:
            if not isinstance(items, (list, tuple)) or not items:
                fields.fail("bins", "a list of open bins, each a non-empty list of items", items)
        bins = [list(items) for items in bins]
        room = [limit - sum(saved_lengths(fields, "bins", items, "pack")) for items in bins]
        if fields.list("free") != room or not all(0 < r < limit for r in room):
            fields.fail(
                "free",
                f"the room left in each open bin, {room}, each in 1..{limit - 1}",
                state["free"],
            )
        ready = fields.stamped_items("ready")
        for items, _ in ready:
            if not isinstance(items, list) or not items:
                fields.fail("ready", "(items, stamp) pairs of non-empty lists of items", items)
        self._bins, self._free = bins, room
        self._stamps = fields.stamps("stamps", length=len(bins))
        self._ready = [(list(items), stamp) for items, stamp in ready]
        self._done = fields.bool("done")

    def load_held_states(
        self, states: list[dict[str, Any]], share: HeldShare | None = None
    ) -> None:
        """This rank's share of the old ranks' open bins and closed rows, a row each
        (see ``HoldsItems``)."""
        held: list[tuple[list[Any], int, tuple]] = []
        ready: list[tuple[list[Any], tuple]] = []
        for state in states:
            self.load_state_dict(state)  # checks the fields
            held += zip(self._bins, self._free, self._stamps)
            ready += self._ready
        mine, ready = share_of(share, held), share_of(share, ready)
        self.reset()
        self._bins = [items for items, _, _ in mine]
        self._free = [free for _, free, _ in mine]
        self._stamps = [stamp for _, _, stamp in mine]
        self._ready = ready
        while len(self._free) > self.buffer_size:  # several ranks' bins: pass the extra on
            self._close_fullest()

    def __repr__(self) -> str:
        return (
            f"Packer(max_length={self.max_length}, strategy={self.strategy!r}, "
            f"buffer_size={self.buffer_size}, oversized={self.oversized!r})"
        )
