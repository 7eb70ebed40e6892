"""Shuffling: a buffered shuffle for streams, a full permutation for map-style blocks."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from .._validate import check_int
from ..errors import NotAvailable
from ._base import IterDataPipe, MapDataPipe
from ._context import current_stamp, restore_stamp
from ._held import HeldShare, HoldsItems, share_of
from ._state_fields import StateFields

__all__ = ["MapShuffler", "Shuffler"]


class Shuffler(IterDataPipe, HoldsItems):
    """Shuffle a stream through a buffer of ``buffer_size`` items (functional: ``shuffle``).

    The buffer is filled first; then each new item replaces a randomly chosen
    buffered item, which is emitted. At the end the rest of the buffer comes out
    in random order. The order depends only on the seed and the epoch: the same
    ``seed`` and epoch give the same order, a new epoch a new one; without any
    seed it follows ``torch.manual_seed``. Each item keeps the stamp
    (``item_rng`` position) it had when it entered the buffer.

    Args:
        source: the stream to shuffle.
        buffer_size: how many items are held; ``>= len(source)`` gives a uniform
            permutation.
        seed: this block's own seed (otherwise the pipeline seed is used).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> dp = Shuffler(IterableWrapper(range(8)), buffer_size=4, seed=1)
        >>> sorted(dp) == list(range(8)), list(dp) == list(dp)
        (True, True)
    """

    inputs = ("source",)

    def __init__(
        self, source: IterDataPipe, buffer_size: int = 10000, *, seed: int | None = None
    ) -> None:
        check_int(
            "buffer_size",
            buffer_size,
            minimum=1,
            hint="use a buffer at least as large as the dataset for a uniform shuffle",
        )
        self.source = source
        self.buffer_size = buffer_size
        self.seed = seed
        self.use_own_seed(seed)
        self.reset()

    def reset(self) -> None:
        self._buffer: list[Any] = []
        self._stamps: list[Any] = []
        self._rng: random.Random | None = None
        self._source_done = False

    def async_next(self) -> Any:
        rng = self._rng
        if rng is None:
            rng = self._rng = random.Random(self.epoch_seed())
        buffer, stamps = self._buffer, self._stamps
        if not self._source_done and len(buffer) <= self.buffer_size:
            source, size = self.source, self.buffer_size
            while True:
                try:
                    item = source.async_next()  # NotAvailable: the partial fill is kept
                except StopIteration:
                    self._source_done = True
                    break
                if len(buffer) < size:
                    buffer.append(item)
                    stamps.append(current_stamp())
                    continue
                index = int(rng.random() * size)
                out, out_stamp = buffer[index], stamps[index]
                buffer[index], stamps[index] = item, current_stamp()
                restore_stamp(out_stamp)
                return out
        if not buffer:
            raise StopIteration
        index = int(rng.random() * len(buffer))
        buffer[index], buffer[-1] = buffer[-1], buffer[index]
        stamps[index], stamps[-1] = stamps[-1], stamps[index]
        restore_stamp(stamps.pop())
        return buffer.pop()

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        state = {
            "buffer": list(self._buffer),
            "stamps": list(self._stamps),
            "rng": None if self._rng is None else self._rng.getstate(),
            "source_done": self._source_done,
        }
        if len(self._buffer) > self.buffer_size:  # still draining several ranks' buffers
            state["merged"] = True
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        buffer = fields.list("buffer")
        if len(buffer) > self.buffer_size and not state.get("merged"):
            fields.fail("buffer", f"a list of at most buffer_size={self.buffer_size} items", buffer)
        self._stamps = fields.stamps("stamps", length=len(buffer))
        self._rng = fields.rng("rng")
        self._source_done = fields.bool("source_done")
        self._buffer = buffer

    def load_held_states(
        self, states: list[dict[str, Any]], share: HeldShare | None = None
    ) -> None:
        """This rank's share of the old ranks' buffers; past ``buffer_size``, items go out
        before more are read."""
        held: list[tuple[Any, Any]] = []
        for state in states:
            self.load_state_dict(state)  # checks the fields
            held.extend(zip(self._buffer, self._stamps))
        mine = share_of(share, held)
        buffer, stamps = [item for item, _ in mine], [stamp for _, stamp in mine]
        rng = next((s["rng"] for s in states if s.get("rng") is not None), None)
        merged = {"buffer": buffer, "stamps": stamps, "rng": rng, "source_done": False}
        self.load_state_dict({**merged, "merged": len(buffer) > self.buffer_size})

    def __repr__(self) -> str:
        return f"Shuffler(buffer_size={self.buffer_size}, seed={self.seed!r})"


class MapShuffler(IterDataPipe):
    """Iterate a map-style block in a seeded random permutation of its indices.

    The result is an ``IterDataPipe`` (``map_dp.shuffle()``). When the next item
    is not ready, the following ``lookahead`` indices of the permutation are
    requested too, so an asynchronous map block can work on them meanwhile.

    Args:
        source: a ``MapDataPipe``.
        indices: the indices (or keys) to shuffle; default ``range(len(source))``.
        seed: this block's own seed (otherwise the pipeline seed is used).

    Example:
        >>> from pipeloom.datapipes import SequenceWrapper
        >>> dp = MapShuffler(SequenceWrapper("abcde"), seed=0)
        >>> sorted(dp), len(dp)
        (['a', 'b', 'c', 'd', 'e'], 5)
    """

    inputs = ("source",)
    lookahead = 8

    def __init__(
        self, source: MapDataPipe, *, indices: Sequence[Any] | None = None, seed: int | None = None
    ) -> None:
        if not isinstance(source, MapDataPipe):
            raise TypeError(
                f"MapShuffler expects a MapDataPipe, got {type(source).__name__}; "
                f"use .shuffle(buffer_size) on an IterDataPipe"
            )
        if indices is not None and (
            isinstance(indices, (str, bytes)) or not isinstance(indices, Sequence)
        ):
            raise TypeError(f"indices must be a list of indices or keys, got {indices!r}")
        self.source = source
        self.indices = None if indices is None else list(indices)
        self.seed = seed
        self.use_own_seed(seed)
        self.reset()

    def reset(self) -> None:
        self._order: list[int] | None = None
        self._order_seed: int | None = None
        self._index = 0
        self._ready: dict[int, tuple[Any, Any]] = {}

    def _make_order(self) -> list[int]:
        if self._order_seed is None:
            self._order_seed = self.epoch_seed()
        order = list(range(len(self.source))) if self.indices is None else list(self.indices)
        random.Random(self._order_seed).shuffle(order)
        self._order = order
        return order

    def async_next(self) -> Any:
        order = self._order
        if order is None:
            order = self._make_order()
        index = self._index
        if index >= len(order):
            raise StopIteration
        key = order[index]
        ready = self._ready.pop(key, None)
        if ready is None:
            try:
                item = self.source.async_get(key)
            except NotAvailable:
                self._request_ahead(order, index + 1)
                raise
        else:
            item, stamp = ready
            restore_stamp(stamp)
        self._index = index + 1
        return item

    def _request_ahead(self, order: list[int], start: int) -> None:
        ready = self._ready
        for key in order[start : start + self.lookahead]:
            if key in ready:
                continue
            try:
                ready[key] = (self.source.async_get(key), current_stamp())
            except NotAvailable:
                pass  # requested; asked again when its turn comes

    def __len__(self) -> int:
        return len(self.source) if self.indices is None else len(self.indices)

    def state_dict(self) -> dict[str, Any]:
        if self._order_seed is None and self._index == 0:
            return {"index": 0, "order_seed": None}
        return {"index": self._index, "order_seed": self._order_seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        index = fields.int("index")
        order_seed = fields.optional_int("order_seed", minimum=None)
        self.reset()
        self._index, self._order_seed = index, order_seed

    def __repr__(self) -> str:
        return f"MapShuffler(seed={self.seed!r})"
