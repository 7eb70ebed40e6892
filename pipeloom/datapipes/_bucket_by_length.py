"""``bucket_by_length``: batches of items of similar length, from a bounded buffer."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

from .._validate import as_length, check_bool
from ._base import IterDataPipe
from ._context import current_stamp, restore_stamp
from ._held import HeldShare, HoldsItems, share_of
from ._map import check_callable, fn_name
from ._state_fields import StateFields

__all__ = ["LengthBucketer", "equal_cost_boundaries"]

Entry = tuple[Any, int, tuple]  # (item, length, stamp)


class LengthBucketer(IterDataPipe, HoldsItems):
    """Batch items of similar length together (functional name: ``bucket_by_length``).

    Bucket ``i`` holds the items whose ``length_fn(item)`` is in
    ``[boundaries[i-1], boundaries[i])`` (``len(boundaries) + 1`` buckets, as
    in tf.data). An item goes to its bucket, and a bucket is emitted as a batch
    when it is full:

    * ``batch_sizes``: it holds ``batch_sizes[i]`` items (one int: every bucket);
    * ``max_tokens``: one more item would make ``items x longest length`` (the
      batch's size once padded) exceed ``max_tokens`` -- checked when an item
      arrives, and ahead of time against the bucket's shortest length. An item
      longer than ``max_tokens`` raises ``ValueError``.

    At most ``buffer_size`` items wait in the buckets: one more, and the bucket
    holding the most items (the lowest on ties) is emitted as it is, so memory
    stays bounded and a rare length is not held forever; give room for a few
    batches per bucket. At the end of the stream the buckets are emitted in
    order (``drop_last`` drops these leftovers). Batches come out in the order
    they were completed; each is a list, e.g. for ``.collate(PadCollate())``.

    With ``num_buckets`` instead of ``boundaries``, the first ``buffer_size``
    items of each epoch are read first and the boundaries are estimated from
    their lengths so that each bucket holds about the same number of tokens
    (lhotse's equal-cost buckets): deterministic, and saved in the state.
    Each bucket keeps its own batch size: when many items share a length, some
    estimated edges coincide and the buckets between them can hold no length,
    so the longest bucket still takes ``batch_sizes[-1]``.

    Args:
        source: the items.
        length_fn: ``item -> int`` length (e.g. ``len``, or
            ``lambda x: len(x["input_ids"])``).
        boundaries: increasing ints ``>= 1``; or use ``num_buckets``.
        num_buckets: how many buckets to estimate.
        batch_sizes: items per batch: an int, or one per bucket; or use ``max_tokens``.
        max_tokens: the padded size a batch may reach.
        buffer_size: the most items held in the buckets.
        drop_last: drop the batches left in the buckets at the end of the stream.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> words = IterableWrapper(["a", "bbb", "cc", "dddd", "e", "fff", "g", "hh"])
        >>> list(words.bucket_by_length(len, boundaries=[3], batch_sizes=2))
        [['a', 'cc'], ['bbb', 'dddd'], ['e', 'g'], ['hh'], ['fff']]
    """

    inputs = ("source",)

    def __init__(
        self,
        source: IterDataPipe,
        length_fn: Callable[[Any], int],
        *,
        boundaries: Sequence[int] | None = None,
        num_buckets: int | None = None,
        batch_sizes: int | Sequence[int] | None = None,
        max_tokens: int | None = None,
        buffer_size: int = 1000,
        drop_last: bool = False,
    ) -> None:
        check_callable(length_fn, "length_fn", "bucket_by_length", 1)
        if (boundaries is None) == (num_buckets is None):
            raise ValueError(
                "bucket_by_length() needs either boundaries=[...] (bucket edges) or "
                "num_buckets=n (edges estimated from the first buffer_size items), not "
                f"{'both' if boundaries is not None else 'neither'}"
            )
        if (batch_sizes is None) == (max_tokens is None):
            raise ValueError(
                "bucket_by_length() needs either batch_sizes= (items per batch) or "
                f"max_tokens= (padded tokens per batch), not "
                f"{'both' if batch_sizes is not None else 'neither'}"
            )
        if boundaries is not None:
            boundaries = list(boundaries)
            for b in boundaries:
                _check_int("boundaries", b, 1)
            if any(b >= c for b, c in zip(boundaries, boundaries[1:])):
                raise ValueError(f"boundaries must increase strictly, got {boundaries}")
        if num_buckets is not None:
            _check_int("num_buckets", num_buckets, 1)
        count = len(boundaries) + 1 if boundaries is not None else int(num_buckets or 0)
        if batch_sizes is not None:
            if isinstance(batch_sizes, int):
                sizes = [batch_sizes] * count
            else:
                sizes = list(batch_sizes)
            for size in sizes:
                _check_int("batch_sizes", size, 1)
            if len(sizes) != count:
                raise ValueError(
                    f"bucket_by_length() has {count} buckets but got {len(sizes)} batch_sizes; "
                    f"give one per bucket (len(boundaries) + 1, or num_buckets) or one int"
                )
            self._sizes: list[int] | None = sizes
        else:
            _check_int("max_tokens", max_tokens, 1)
            self._sizes = None
        _check_int("buffer_size", buffer_size, 1)
        check_bool("drop_last", drop_last)
        self.source = source
        self.length_fn = length_fn
        self.boundaries = boundaries
        self.num_buckets = num_buckets
        self.batch_sizes = batch_sizes
        self.max_tokens = max_tokens
        self.buffer_size = buffer_size
        self.drop_last = drop_last
        self.reset()

    def reset(self) -> None:
        # None until estimated; estimated edges may repeat (an empty bucket between)
        self._edges: list[int] | None = self.boundaries
        self._sample: list[Entry] = []  # items read to estimate the edges
        count = self.num_buckets if self._edges is None else len(self._edges) + 1
        self._buckets: list[list[Entry]] = [[] for _ in range(count or 0)]
        self._ready: list[tuple[list[Any], tuple]] = []
        self._done = False

    def async_next(self) -> Any:
        while not self._ready:
            if self._done:
                raise StopIteration
            try:
                item = self.source.async_next()  # NotAvailable: nothing pulled, nothing lost
            except StopIteration:
                self._finish()
                continue
            entry = (item, self._length(item), current_stamp())
            if self._edges is None:
                self._sample.append(entry)
                if len(self._sample) >= self.buffer_size:
                    self._estimate()
            else:
                self._add(entry)
        batch, stamp = self._ready.pop(0)
        restore_stamp(stamp)
        return batch

    def _length(self, item: Any) -> int:
        returned = self.length_fn(item)
        length = as_length(returned)
        if length is None or length < 0:
            raise TypeError(
                f"bucket_by_length() expects length_fn {fn_name(self.length_fn)} to return "
                f"an int >= 0 (a NumPy integer or a 0-d integer tensor will do), got "
                f"{type(returned).__name__} {returned!r}"
            )
        return length

    def _estimate(self) -> None:
        assert self.num_buckets is not None
        self._edges = equal_cost_edges([n for _, n, _ in self._sample], self.num_buckets)
        sample, self._sample = self._sample, []
        for entry in sample:
            self._add(entry)

    def _add(self, entry: Entry) -> None:
        assert self._edges is not None
        length, edges = entry[1], self._edges
        index = bisect.bisect_right(edges, length)
        bucket = self._buckets[index]
        if self._sizes is not None:
            bucket.append(entry)
            if len(bucket) >= self._sizes[index]:
                self._emit(index)
        else:
            budget = self.max_tokens
            assert budget is not None
            if length > budget:
                raise ValueError(
                    f"bucket_by_length() got an item of length {length} > max_tokens="
                    f"{budget}, which no batch can hold; filter long items out first "
                    f"(e.g. .filter(lambda x: length_fn(x) <= {budget})) or raise max_tokens"
                )
            if bucket and (len(bucket) + 1) * max(_longest(bucket), length) > budget:
                self._emit(index)
                bucket = self._buckets[index]
            bucket.append(entry)
            shortest_next = edges[index - 1] if index else 0
            if (len(bucket) + 1) * max(_longest(bucket), shortest_next) > budget:
                self._emit(index)
        if sum(map(len, self._buckets)) > self.buffer_size:
            self._emit(max(range(len(self._buckets)), key=lambda i: (len(self._buckets[i]), -i)))

    def _emit(self, index: int) -> None:
        bucket = self._buckets[index]
        self._ready.append(([item for item, _, _ in bucket], bucket[0][2]))
        self._buckets[index] = []

    def _finish(self) -> None:
        self._done = True
        if self._edges is None and self._sample:
            self._estimate()
        for index, bucket in enumerate(self._buckets):
            if bucket and not self.drop_last:
                self._emit(index)
        self._buckets = [[] for _ in self._buckets]

    def state_dict(self) -> dict[str, Any]:
        return {
            "boundaries": None if self._edges is None else list(self._edges),
            "sample": list(self._sample),
            "buckets": [list(bucket) for bucket in self._buckets],
            "ready": [(list(batch), stamp) for batch, stamp in self._ready],
            "done": self._done,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        if "boundaries" not in state:
            fields.list("boundaries")  # raises: the state has no field 'boundaries'
        edges = self._saved_edges(fields, state["boundaries"])
        sample = [_entry(fields, "sample", e) for e in fields.list("sample")]
        count = self.num_buckets if self.boundaries is None else len(self.boundaries) + 1
        buckets = fields.list("buckets")
        if len(buckets) != count or not all(isinstance(b, (list, tuple)) for b in buckets):
            fields.fail("buckets", f"a list of {count} buckets (lists of entries)", buckets)
        buckets = [[_entry(fields, "buckets", e) for e in bucket] for bucket in buckets]
        for index, bucket in enumerate(buckets):  # each entry in the bucket its length picks
            if any(edges is None or bisect.bisect_right(edges, n) != index for _, n, _ in bucket):
                fields.fail(
                    "buckets", f"entries in the bucket of their length (edges {edges})", bucket
                )
        if (sample and edges is not None) or len(sample) >= self.buffer_size:
            fields.fail(
                "sample",
                f"fewer than buffer_size={self.buffer_size} entries, before "
                f"the edges are estimated",
                sample,
            )
        if sum(map(len, buckets)) > self.buffer_size:
            fields.fail("buckets", f"at most buffer_size={self.buffer_size} entries", buckets)
        ready = fields.stamped_items("ready")
        if not all(isinstance(batch, list) and batch for batch, _ in ready):
            fields.fail("ready", "(batch, stamp) pairs of non-empty lists", ready)
        self._edges, self._sample, self._buckets = edges, sample, buckets
        self._ready = [(list(batch), stamp) for batch, stamp in ready]
        self._done = fields.bool("done")

    def _saved_edges(self, fields: StateFields, edges: Any) -> list[int] | None:
        """The saved boundaries: this block's own, or estimated ones (None: not yet)."""
        if edges is None and self.boundaries is None:
            return None
        valid = isinstance(edges, (list, tuple)) and all(
            isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in edges
        )
        if not valid or any(b > c for b, c in zip(edges, edges[1:])):
            fields.fail("boundaries", "non-decreasing ints >= 1", edges)
        if self.boundaries is not None and list(edges) != self.boundaries:
            fields.fail("boundaries", f"this block's boundaries, {self.boundaries}", edges)
        if self.num_buckets is not None and len(edges) != self.num_buckets - 1:
            fields.fail("boundaries", f"num_buckets - 1 = {self.num_buckets - 1} edges", edges)
        return list(edges)

    def load_held_states(
        self, states: list[dict[str, Any]], share: HeldShare | None = None
    ) -> None:
        """This rank's share of the old ranks' sampled and bucketed items and ready batches,
        bucketed again by this block's edges."""
        entries: list[Entry] = []
        saved_edges: list[list[int] | None] = []
        ready: list[tuple[list[Any], tuple]] = []
        for state in states:
            self.load_state_dict(state)  # checks the fields
            saved_edges.append(self._edges)
            entries += self._sample + [entry for bucket in self._buckets for entry in bucket]
            ready += self._ready
        entries, ready = share_of(share, entries), share_of(share, ready)
        self.reset()
        self._ready = ready
        if self._edges is None:  # estimated: the first rank's edges, else a sample as before
            self._edges = next((edges for edges in saved_edges if edges is not None), None)
        if self._edges is None:
            self._sample = entries
            if len(self._sample) >= self.buffer_size:
                self._estimate()
            return
        self._buckets += [[] for _ in range(len(self._edges) + 1 - len(self._buckets))]
        for entry in entries:
            self._add(entry)

    def __repr__(self) -> str:
        edges = (
            f"boundaries={self.boundaries}"
            if self.boundaries is not None
            else f"num_buckets={self.num_buckets}"
        )
        size = (
            f"batch_sizes={self.batch_sizes!r}"
            if self.batch_sizes is not None
            else f"max_tokens={self.max_tokens}"
        )
        return (
            f"LengthBucketer(length_fn={fn_name(self.length_fn)}, {edges}, {size}, "
            f"buffer_size={self.buffer_size}, drop_last={self.drop_last})"
        )


def equal_cost_boundaries(lengths: Sequence[int], num_buckets: int) -> list[int]:
    """Bucket edges that split ``lengths`` into ``num_buckets`` of about equal total length.

    Fewer edges come back when lengths repeat (each edge is used once).

    Example:
        >>> equal_cost_boundaries([1, 1, 1, 1, 2, 2, 4], 3)
        [2, 3]
    """
    return sorted(set(equal_cost_edges(lengths, num_buckets)))


def equal_cost_edges(lengths: Sequence[int], num_buckets: int) -> list[int]:
    """The ``num_buckets - 1`` edges of :func:`equal_cost_boundaries`, repeats kept.

    Edge ``i`` closes bucket ``i``, so bucket ``i`` (and its batch size) stays
    bucket ``i`` when lengths repeat; a bucket between two equal edges holds
    no length. No edges for no lengths.

    Example:
        >>> equal_cost_edges([5, 5, 5, 5, 9], 4)  # bucket 1 is [6, 6): empty
        [6, 6, 10]
    """
    ordered = sorted(lengths)
    total = sum(ordered)
    edges: list[int] = []
    running, target = 0, 1
    for length in ordered:
        running += length
        while target < num_buckets and running * num_buckets >= target * total:
            edges.append(length + 1)
            target += 1
    return edges


def _check_int(name: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(
            f"bucket_by_length() expects {name} to be int(s) >= {least}, got {value!r}"
        )


def _longest(bucket: list[Entry]) -> int:
    return max(length for _, length, _ in bucket)


def _entry(fields: StateFields, name: str, entry: Any) -> Entry:
    """A saved ``(item, length, stamp)`` entry, checked."""
    if not isinstance(entry, (list, tuple)) or len(entry) != 3:
        fields.fail(name, "(item, length, stamp) entries", entry)
    item, length, stamp = entry
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        fields.fail(name, "entries whose length is an int >= 0", entry)
    return item, length, fields.check_stamp(name, stamp)
