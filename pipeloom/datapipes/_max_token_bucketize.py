"""``max_token_bucketize``: torchdata 0.9's token-budget batching from a min-heap."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from .._validate import as_length, check_bool
from ._base import IterDataPipe
from ._context import current_stamp, restore_stamp
from ._held import HeldShare, HoldsItems, share_of
from ._map import check_callable, fn_name
from ._state_fields import StateFields

__all__ = ["MaxTokenBucketizer"]


class _Sized:
    """A heap entry ordered by length only, so ties pop as torchdata's heap pops them."""

    __slots__ = ("length", "item", "stamp")

    def __init__(self, length: int, item: Any, stamp: tuple) -> None:
        self.length, self.item, self.stamp = length, item, stamp

    def __lt__(self, other: _Sized) -> bool:
        return self.length < other.length


class MaxTokenBucketizer(IterDataPipe, HoldsItems):
    """Batches within a token budget, from a min-heap (functional: ``max_token_bucketize``).

    torchdata 0.9's block, with its arguments and output: items whose
    ``len_fn`` length is outside ``[min_len, max_len]`` are dropped; the rest
    go into a min-heap of ``buffer_size`` items; each time it is full the
    shortest item is popped and added to the current batch, and the batch is
    emitted first when the item would take it past ``max_token_count`` (its
    summed lengths, or with ``include_padding`` its size once padded: items x
    longest). At the end the heap is drained the same way. Batches therefore
    grow in length within a buffer; shuffle before and after to vary them. For
    length buckets with a fixed number of buckets, see ``bucket_by_length``.
    On a resume on another number of ranks each new rank takes its share of
    the items of the old ranks' heaps and current batches (``HoldsItems``):
    they go back into its heap, which pops one item per new item until the
    end.

    Args:
        source: the items.
        max_token_count: the most tokens a batch may hold.
        len_fn: ``item -> int`` (default ``len``).
        min_len: shorter items are dropped.
        max_len: longer items are dropped (default ``max_token_count``).
        buffer_size: how many items the heap holds.
        include_padding: count the padding a later block adds.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> dp = IterableWrapper(["1", "11", "1", "1111", "111", "1", "11", "11", "111"])
        >>> list(dp.max_token_bucketize(max_token_count=5))
        [['1', '1', '1', '11'], ['11', '11'], ['111'], ['111'], ['1111']]
    """

    inputs = ("source",)

    def __init__(
        self,
        source: IterDataPipe,
        max_token_count: int,
        len_fn: Callable[[Any], int] = len,
        min_len: int = 0,
        max_len: int | None = None,
        buffer_size: int = 1000,
        include_padding: bool = False,
    ) -> None:
        check_callable(len_fn, "len_fn", "max_token_bucketize", 1)
        limit = max_token_count if max_len is None else max_len
        for name, value in (
            ("max_token_count", max_token_count),
            ("min_len", min_len),
            ("max_len", limit),
            ("buffer_size", buffer_size),
        ):
            least = 0 if name == "min_len" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(
                    f"max_token_bucketize() expects {name} to be an int >= {least}, got {value!r}"
                )
        if min_len > limit:
            raise ValueError(
                f"max_token_bucketize() expects min_len <= max_len, got min_len={min_len} "
                f"and max_len={limit}"
            )
        if limit > max_token_count:
            raise ValueError(
                f"max_token_bucketize() expects max_len <= max_token_count (a longer item "
                f"fits no batch), got max_len={limit} and max_token_count={max_token_count}"
            )
        check_bool("include_padding", include_padding)
        self.source = source
        self.max_token_count = max_token_count
        self.len_fn = len_fn
        self.min_len = min_len
        self.max_len = limit
        self.buffer_size = buffer_size
        self.include_padding = include_padding
        self.reset()

    def reset(self) -> None:
        self._heap: list[_Sized] = []
        self._batch: list[Any] = []
        self._batch_stamp: tuple = (None, 0, None, 0)
        self._tokens = 0  # the current batch's count (summed, or padded)
        self._longest = 0
        self._ready: tuple[list[Any], tuple] | None = None
        self._source_done = False

    def async_next(self) -> Any:
        while self._ready is None:
            if not self._source_done:
                try:
                    item = self.source.async_next()  # NotAvailable: nothing pulled, nothing lost
                except StopIteration:
                    self._source_done = True
                    continue
                length = self._length(item)
                if self.min_len <= length <= self.max_len:
                    heapq.heappush(self._heap, _Sized(length, item, current_stamp()))
                    if len(self._heap) >= self.buffer_size:  # more: several ranks' heaps
                        self._pop()
            elif self._heap:
                self._pop()
            elif self._batch:
                self._ready = (self._batch, self._batch_stamp)
                self._batch = []
            else:
                raise StopIteration
        batch, stamp = self._ready
        self._ready = None
        restore_stamp(stamp)
        return batch

    def _length(self, item: Any) -> int:
        returned = self.len_fn(item)
        length = as_length(returned)
        if length is None:
            raise TypeError(
                f"max_token_bucketize() expects len_fn {fn_name(self.len_fn)} to return an "
                f"int (a NumPy integer or a 0-d integer tensor will do), got "
                f"{type(returned).__name__} {returned!r}"
            )
        return length

    def _pop(self) -> None:
        entry = heapq.heappop(self._heap)
        if self.include_padding:
            longest = max(entry.length, self._longest)
            tokens = (len(self._batch) + 1) * longest
        else:
            longest, tokens = self._longest, self._tokens + entry.length
        if tokens > self.max_token_count:
            self._ready = (self._batch, self._batch_stamp)
            self._batch, self._tokens, self._longest = [], entry.length, entry.length
        else:
            self._tokens, self._longest = tokens, longest
        if not self._batch:
            self._batch_stamp = entry.stamp
        self._batch.append(entry.item)

    def state_dict(self) -> dict[str, Any]:
        return {
            "heap": [(e.length, e.item, e.stamp) for e in self._heap],  # in heap order
            "batch": list(self._batch),
            "batch_stamp": self._batch_stamp,
            "tokens": self._tokens,
            "longest": self._longest,
            "ready": None if self._ready is None else (list(self._ready[0]), self._ready[1]),
            "source_done": self._source_done,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        heap = []
        for entry in fields.list("heap"):
            if not isinstance(entry, (list, tuple)) or len(entry) != 3:
                fields.fail("heap", "(length, item, stamp) entries", entry)
            length, item, stamp = entry
            if not (isinstance(length, int) and self.min_len <= length <= self.max_len):
                fields.fail("heap", f"entries of lengths in {self.min_len}..{self.max_len}", entry)
            heap.append(_Sized(length, item, fields.check_stamp("heap", stamp)))
        if any(heap[i] < heap[(i - 1) // 2] for i in range(1, len(heap))):
            fields.fail(
                "heap", "entries in heap order (each no shorter than its parent)", state["heap"]
            )
        batch = fields.list("batch")
        tokens, longest = fields.int("tokens"), fields.int("longest")
        if batch:  # the running count agrees with the batch (stale once it was sent)
            lengths = [self._length(item) for item in batch]
            padded = self.include_padding
            expected = len(batch) * max(lengths) if padded else sum(lengths)
            if tokens != expected or tokens > self.max_token_count:
                fields.fail("tokens", f"the batch's token count, {expected}", tokens)
            if padded and longest != max(lengths):
                fields.fail("longest", f"the batch's longest length, {max(lengths)}", longest)
        if "ready" not in state:
            fields.list("ready")  # raises: the state has no field 'ready'
        ready = state["ready"]
        if ready is not None:
            ((items, stamp),) = fields.stamped_items("ready", value=[ready])
            if not isinstance(items, list) or not items:
                fields.fail("ready", "None or a (batch, stamp) pair", ready)
            ready = (items, stamp)
        self._heap, self._batch, self._tokens, self._longest = heap, batch, tokens, longest
        self._batch_stamp = fields.stamp("batch_stamp")
        self._ready = ready
        self._source_done = fields.bool("source_done")

    def load_held_states(
        self, states: list[dict[str, Any]], share: HeldShare | None = None
    ) -> None:
        """This rank's share of the old ranks' heaps and current (or finished, unsent)
        batches' items, in one heap."""
        heap: list[_Sized] = []
        for state in states:
            self.load_state_dict(state)  # checks the fields
            heap += self._heap
            batches = [(self._batch, self._batch_stamp)]
            if self._ready is not None:
                batches.append(self._ready)
            for items, stamp in batches:
                heap.extend(_Sized(self._length(item), item, stamp) for item in items)
        heap = share_of(share, heap)
        heapq.heapify(heap)
        self.reset()
        self._heap = heap

    def __repr__(self) -> str:
        return (
            f"MaxTokenBucketizer(max_token_count={self.max_token_count}, "
            f"len_fn={fn_name(self.len_fn)}, min_len={self.min_len}, max_len={self.max_len}, "
            f"buffer_size={self.buffer_size}, include_padding={self.include_padding})"
        )
