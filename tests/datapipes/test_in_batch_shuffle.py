"""Tests of ``in_batch_shuffle`` (InBatchShuffler)."""

from __future__ import annotations

import pytest
from hypothesis import given

from pipeloom.datapipes import InBatchShuffler, IterableWrapper
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.strategies import item_lists, positive_sizes, seeds


def make(n=40, size=8, seed=None):
    return IterableWrapper(range(n)).batch(size).in_batch_shuffle(seed=seed)


@given(item_lists, positive_sizes, seeds)
def test_each_batch_keeps_its_items(items, size, seed):
    out = collect(IterableWrapper(items).batch(size).in_batch_shuffle(), seed=seed)
    assert [sorted(b) for b in out] == [
        sorted(items[i : i + size]) for i in range(0, len(items), size)
    ]


def test_order_is_reproducible_per_seed_and_changes_with_the_epoch():
    assert collect(make(), seed=3) == collect(make(), seed=3)
    assert collect(make(), seed=3) != collect(make(), seed=3, epoch=1)
    assert collect(make(), seed=3) != collect(make(), seed=4)
    assert collect(make(), seed=3) != collect(IterableWrapper(range(40)).batch(8), seed=3)


def test_own_seed_overrides_the_pipeline_seed():
    assert collect(make(seed=5), seed=1) == collect(make(seed=5), seed=2)


def test_the_input_batch_is_not_modified_and_tuples_stay_tuples():
    batch = [1, 2, 3, 4, 5, 6]
    out = collect(IterableWrapper([batch, tuple(batch)]).in_batch_shuffle())
    assert batch == [1, 2, 3, 4, 5, 6]
    assert type(out[0]) is list and type(out[1]) is tuple


def test_non_batches_are_a_clear_type_error():
    with pytest.raises(TypeError, match="shuffles batches that are lists or tuples, got a int"):
        list(IterableWrapper([1]).in_batch_shuffle())


def test_bad_seed_is_a_type_error():
    with pytest.raises(TypeError, match="seed must be an int or None"):
        IterableWrapper([]).in_batch_shuffle(seed="x")


def test_repr_len_and_type():
    dp = make(seed=7)
    assert repr(dp) == "InBatchShuffler(seed=7)" and len(dp) == 5 and type(dp) is InBatchShuffler


def test_resume_restores_the_rng_and_async_agrees():
    check_resume_from_every_step(lambda: make(20, 4), seed=11)
    assert collect(make(), seed=2) == collect_async(make(), seed=2)
