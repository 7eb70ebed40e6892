"""Tests of ``bucketbatch`` (BucketBatcher)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import BucketBatcher, IterableWrapper
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.helpers import Stutter, drive
from tests.strategies import item_lists, positive_sizes, seeds

configs = st.fixed_dictionaries(
    {
        "batch_size": st.integers(1, 5),
        "drop_last": st.booleans(),
        "batch_num": st.integers(1, 4),
        "bucket_num": st.integers(1, 3),
        "sort_key": st.sampled_from([None, sorted]),
        "use_in_batch_shuffle": st.booleans(),
    }
)


@given(item_lists, configs, seeds)
@settings(max_examples=60)
def test_every_item_appears_once_in_batches_of_batch_size(items, config, seed):
    batches = collect(IterableWrapper(items).bucketbatch(**config), seed=seed)
    size = config["batch_size"]
    short = [b for b in batches if len(b) != size]
    if config["drop_last"]:
        assert not short
        assert sum(map(len, batches)) == len(items) - len(items) % size
        assert Counter(x for b in batches for x in b) <= Counter(items)
    else:
        assert len(short) <= 1 and all(0 < len(b) < size for b in short)
        assert Counter(x for b in batches for x in b) == Counter(items)
    assert len(batches) == len(IterableWrapper(items).bucketbatch(**config))


def test_sort_key_makes_each_bucket_sorted_and_batches_contiguous():
    items = list(range(40))
    random.Random(1).shuffle(items)
    dp = IterableWrapper(items).bucketbatch(
        4, batch_num=5, sort_key=sorted, use_in_batch_shuffle=False
    )
    batches = collect(dp)
    assert all(b == sorted(b) for b in batches)
    for bucket in (sorted(items[:20]), sorted(items[20:])):
        mine = sorted(b for b in batches if b[0] in bucket)
        assert mine == [bucket[i : i + 4] for i in range(0, 20, 4)]


def test_batch_order_is_shuffled_but_reproducible_per_seed_and_epoch():
    def make():
        return IterableWrapper(range(60)).bucketbatch(3, batch_num=20, sort_key=sorted)

    assert collect(make(), seed=1) == collect(make(), seed=1)
    assert collect(make(), seed=1) != collect(make(), seed=1, epoch=1)
    assert collect(make(), seed=1) != collect(make(), seed=2)
    assert collect(make(), seed=1) != [list(range(i, i + 3)) for i in range(0, 60, 3)]


def test_without_sort_key_the_pool_is_shuffled():
    batches = collect(IterableWrapper(range(30)).bucketbatch(5, batch_num=6))
    assert sorted(x for b in batches for x in b) == list(range(30))
    assert [x for b in batches for x in b] != list(range(30))


def test_sort_key_returning_the_wrong_number_of_items_is_a_value_error():
    dp = IterableWrapper(range(6)).bucketbatch(2, sort_key=lambda b: b[:1])
    with pytest.raises(
        ValueError, match="must return the bucket's items sorted, but returned 1 items"
    ):
        list(dp)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"batch_size": 0}, ValueError, "batch_size must be an int >= 1, got 0"),
        ({"batch_size": 2, "batch_num": 0}, ValueError, "batch_num must be an int >= 1, got 0"),
        ({"batch_size": 2, "bucket_num": -1}, ValueError, "bucket_num must be an int >= 1, got -1"),
        ({"batch_size": 2, "sort_key": "len"}, TypeError, "sort_key to be None or a callable"),
        (
            {"batch_size": 2, "use_in_batch_shuffle": 1},
            TypeError,
            "use_in_batch_shuffle must be a bool, got int 1; pass True or False",
        ),
    ],
)
def test_bad_arguments_are_rejected_at_construction(kwargs, error, message):
    with pytest.raises(error, match=message):
        IterableWrapper([1]).bucketbatch(**kwargs)


def test_repr_shows_the_arguments():
    dp = IterableWrapper([1]).bucketbatch(4, sort_key=sorted)
    assert type(dp) is BucketBatcher
    assert repr(dp) == (
        "BucketBatcher(batch_size=4, drop_last=False, batch_num=100, bucket_num=1, "
        "sort_key=sorted, use_in_batch_shuffle=True)"
    )


def test_resume_from_every_step_keeps_buffers_and_rng():
    check_resume_from_every_step(
        lambda: Stutter(IterableWrapper(range(23))).bucketbatch(
            2, batch_num=3, bucket_num=2, sort_key=sorted
        )
    )
    check_resume_from_every_step(
        lambda: IterableWrapper(range(17)).bucketbatch(3, drop_last=True, batch_num=2)
    )


def test_not_available_while_filling_a_pool_loses_nothing():
    items, stalls = drive(Stutter(IterableWrapper(range(50)), rate=0.6).bucketbatch(4, batch_num=3))
    assert sorted(x for b in items for x in b) == list(range(50)) and stalls > 0


@given(item_lists, positive_sizes, seeds)
@settings(max_examples=30)
def test_sync_and_async_iteration_agree(items, size, seed):
    def make():
        return Stutter(IterableWrapper(items), seed=seed % 1000).bucketbatch(
            size, batch_num=2, sort_key=sorted
        )

    assert collect(make(), seed=seed) == collect_async(make(), seed=seed)
