"""``bucketbatch``: batches of similar items, in a random but reproducible order."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from .._validate import check_bool, check_int
from ._base import IterDataPipe
from ._batch import batch_count, check_batch_args
from ._context import current_stamp, restore_stamp
from ._held import HeldShare, HoldsItems, share_of
from ._map import fn_name
from ._state_fields import StateFields

__all__ = ["BucketBatcher"]


class BucketBatcher(IterDataPipe, HoldsItems):
    """Batch items from sorted buckets, shuffled per pool (functional name: ``bucketbatch``).

    The stream is read one *pool* of ``batch_size * batch_num * bucket_num``
    items at a time. A pool is shuffled (unless ``sort_key`` is given with
    ``bucket_num == 1``, where sorting makes it pointless), cut into buckets of
    ``batch_size * batch_num`` items, each bucket is passed to ``sort_key``
    (which returns it sorted, e.g. by length), the buckets are cut into batches,
    and, with ``sort_key``, the order of the pool's batches is shuffled. So
    similar items share a batch while the batch order stays random. Randomness
    comes from ``epoch_seed()``: the same seed and epoch give the same batches.
    On a resume on another number of ranks each new rank takes its share of
    the old ranks' pooled items and unsent batches (``HoldsItems``).

    Args:
        source: the upstream block.
        batch_size: items per batch.
        drop_last: drop the last batch when it is short.
        batch_num: batches per bucket.
        bucket_num: buckets per shuffling pool.
        sort_key: ``list -> sorted list`` applied to each bucket, or None.
        use_in_batch_shuffle: also shuffle the items inside each batch.
            (torchdata uses this flag to choose between chunk- and
            buffer-shuffling; here pools are always shuffled as chunks, which
            keeps the order reproducible and checkpoints small.)

    Example:
        >>> from pipeloom.datapipes import IterableWrapper, seed_pipeline
        >>> dp = IterableWrapper([3, 1, 2, 9, 7, 8]).bucketbatch(
        ...     3, batch_num=2, sort_key=sorted, use_in_batch_shuffle=False)
        >>> seed_pipeline(dp, 0)
        >>> sorted(list(dp))
        [[1, 2, 3], [7, 8, 9]]
    """

    inputs = ("source",)

    def __init__(
        self,
        source: IterDataPipe,
        batch_size: int,
        drop_last: bool = False,
        batch_num: int = 100,
        bucket_num: int = 1,
        sort_key: Callable[[list], list] | None = None,
        use_in_batch_shuffle: bool = True,
    ) -> None:
        check_batch_args("bucketbatch", batch_size, drop_last)
        check_int("batch_num", batch_num, minimum=1)
        check_int("bucket_num", bucket_num, minimum=1)
        if sort_key is not None and not callable(sort_key):
            raise TypeError(
                f"bucketbatch() expects sort_key to be None or a callable that takes a "
                f"list of items and returns it sorted, got {type(sort_key).__name__}"
            )
        check_bool("use_in_batch_shuffle", use_in_batch_shuffle)
        self.source = source
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.batch_num = batch_num
        self.bucket_num = bucket_num
        self.sort_key = sort_key
        self.use_in_batch_shuffle = use_in_batch_shuffle
        self.reset()

    def reset(self) -> None:
        self._pool: list[Any] = []
        self._stamps: list[tuple] = []
        self._ready: list[tuple[list[Any], tuple]] = []  # (batch, stamp), last emitted first
        self._rng: random.Random | None = None

    def async_next(self) -> Any:
        while not self._ready:
            pool, stamps = self._pool, self._stamps
            pull, size = self.source.async_next, self.batch_size * self.batch_num * self.bucket_num
            try:
                while len(pool) < size:  # NotAvailable keeps the partial pool
                    pool.append(pull())
                    stamps.append(current_stamp())
            except StopIteration:
                if not pool:
                    raise
            self._ready = self._make_batches(pool, stamps)
            self._pool, self._stamps = [], []
        batch, stamp = self._ready.pop()
        restore_stamp(stamp)
        return batch

    def _make_batches(self, pool: list[Any], stamps: list[tuple]) -> list[tuple[list[Any], tuple]]:
        rng = self._rng
        if rng is None:
            rng = self._rng = random.Random(self.epoch_seed())
        sort_key, size = self.sort_key, self.batch_size
        if sort_key is None or self.bucket_num > 1:
            rng.shuffle(pool)
        if sort_key is not None:
            bucket = size * self.batch_num
            pool = [
                x
                for start in range(0, len(pool), bucket)
                for x in self._sorted(pool[start : start + bucket])
            ]
        # A batch carries the stamp of the item that completed it in arrival order.
        batches = [
            (pool[start : start + size], stamps[min(start + size, len(pool)) - 1])
            for start in range(0, len(pool), size)
        ]
        if self.drop_last and len(batches[-1][0]) < size:
            batches.pop()
        if sort_key is not None:
            rng.shuffle(batches)
        if self.use_in_batch_shuffle:
            for batch, _ in batches:
                rng.shuffle(batch)
        batches.reverse()
        return batches

    def _sorted(self, bucket: list[Any]) -> list[Any]:
        result = list(self.sort_key(bucket))  # type: ignore[misc]
        if len(result) != len(bucket):
            raise ValueError(
                f"sort_key {fn_name(self.sort_key)} must return the bucket's items sorted, "
                f"but returned {len(result)} items for a bucket of {len(bucket)}; note that "
                f"sort_key receives the whole list (e.g. sort_key=lambda b: sorted(b, key=len))"
            )
        return result

    def __len__(self) -> int:
        return batch_count(len(self.source), self.batch_size, self.drop_last)

    def state_dict(self) -> dict[str, Any]:
        return {
            "pool": list(self._pool),
            "stamps": list(self._stamps),
            "ready": [(list(batch), stamp) for batch, stamp in self._ready],
            "rng": None if self._rng is None else self._rng.getstate(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        pool = fields.list("pool")
        size = self.batch_size * self.batch_num * self.bucket_num
        if len(pool) >= size:
            fields.fail("pool", f"a partial pool of fewer than {size} items", pool)
        self._stamps = fields.stamps("stamps", length=len(pool))
        ready = fields.stamped_items("ready")
        if not all(isinstance(batch, list) for batch, _ in ready):
            fields.fail("ready", "a list of (batch list, stamp) pairs", state["ready"])
        self._rng = fields.rng("rng")
        self._pool, self._ready = pool, ready

    def load_held_states(
        self, states: list[dict[str, Any]], share: HeldShare | None = None
    ) -> None:
        """This rank's share of the old ranks' unsent batches and pooled items; full pools
        of them are batched now."""
        held: list[tuple[Any, tuple]] = []
        ready: list[tuple[list[Any], tuple]] = []
        for state in states:
            self.load_state_dict(state)  # checks the fields
            held += zip(self._pool, self._stamps)
            ready += self._ready
        mine, ready = share_of(share, held), share_of(share, ready)
        pool, stamps = [item for item, _ in mine], [stamp for _, stamp in mine]
        self.reset()
        self._rng = next((StateFields(self, s).rng("rng") for s in states if s["rng"]), None)
        size = self.batch_size * self.batch_num * self.bucket_num
        while len(pool) >= size:  # batched as a pool read in one go would be
            ready[:0] = self._make_batches(pool[:size], stamps[:size])
            pool, stamps = pool[size:], stamps[size:]
        self._pool, self._stamps, self._ready = pool, stamps, ready

    def __repr__(self) -> str:
        sort_key = None if self.sort_key is None else fn_name(self.sort_key)
        return (
            f"BucketBatcher(batch_size={self.batch_size}, drop_last={self.drop_last}, "
            f"batch_num={self.batch_num}, bucket_num={self.bucket_num}, sort_key={sort_key}, "
            f"use_in_batch_shuffle={self.use_in_batch_shuffle})"
        )
