"""Tests for ShardingFilter."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import (
    IterableWrapper,
    IterDataPipe,
    ShardingFilter,
    current_position,
)
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.helpers import Flaky, drain_retrying
from tests.strategies import item_lists, shard_counts


class WithPosition(IterDataPipe):
    inputs = ("source",)

    def __init__(self, source):
        self.source = source

    def async_next(self):
        item = self.source.async_next()
        return item, current_position()

    def state_dict(self):
        return {}


def shard(items, total, index, group_size=1):
    dp = IterableWrapper(items).sharding_filter()
    assert isinstance(dp, ShardingFilter)
    dp.sharding_settings(total, index)
    dp.set_shard_group_size(group_size)
    return dp


@settings(max_examples=60, deadline=None)
@given(items=item_lists, total=shard_counts, group=st.integers(1, 5))
def test_shards_partition_the_stream_and_keep_its_order(items, total, group):
    tagged = list(enumerate(items))
    shards = [collect(shard(tagged, total, i, group)) for i in range(total)]
    for part in shards:
        assert part == sorted(part)
    assert sorted(x for part in shards for x in part) == tagged
    for i, part in enumerate(shards):
        assert len(shard(tagged, total, i, group)) == len(part)


def test_default_is_a_single_shard_that_passes_everything():
    dp = IterableWrapper(range(5)).sharding_filter()
    assert dp.is_shardable()
    assert list(dp) == [0, 1, 2, 3, 4]
    assert len(dp) == 5
    assert repr(dp) == "ShardingFilter(total=1, index=0)"


def test_round_robin_and_grouped_assignment():
    assert list(shard(range(10), 3, 0)) == [0, 3, 6, 9]
    assert list(shard(range(10), 2, 1, group_size=3)) == [3, 4, 5, 9]
    assert repr(shard(range(3), 2, 1, 3)) == "ShardingFilter(total=2, index=1, group_size=3)"


def test_calling_sharding_settings_again_replaces_the_settings():
    dp = shard(range(6), 3, 2)
    dp.sharding_settings(2, 0)
    assert list(dp) == [0, 2, 4]


def test_kept_items_are_stamped_with_their_global_position():
    pairs = collect(WithPosition(shard(list("abcdefg"), 3, 1)))
    assert pairs == [("b", 1), ("e", 4)]


@pytest.mark.parametrize(
    ("total", "index", "match"),
    [
        (0, 0, r"total must be an int >= 1, got 0"),
        (2, 2, r"index must be an int in \[0, 2\), got 2; shards are numbered 0 .. 1"),
        (2, -1, r"index must be an int .* got -1"),
        (True, 0, r"total must be an int >= 1, got True"),
        (2, 1.0, r"got 1.0"),
    ],
)
def test_invalid_sharding_settings_are_rejected(total, index, match):
    with pytest.raises(ValueError, match=match):
        IterableWrapper([1]).sharding_filter().sharding_settings(total, index)


def test_invalid_group_size_is_rejected():
    with pytest.raises(ValueError, match=r"group_size must be an int >= 1, got 0"):
        IterableWrapper([1]).sharding_filter().set_shard_group_size(0)


def test_retrying_after_not_available_and_async_path():
    def make():
        dp = Flaky(range(30), seed=2).sharding_filter()
        dp.sharding_settings(4, 3)
        return dp

    expected = list(range(3, 30, 4))
    assert drain_retrying(make()) == expected
    assert collect_async(make()) == expected


def test_len_without_a_source_length_raises_type_error():
    dp = IterableWrapper(iter_forever()).sharding_filter()
    with pytest.raises(TypeError):
        len(dp)


class iter_forever:
    def __iter__(self):
        return iter(range(3))


def test_resume_from_every_step():
    check_resume_from_every_step(lambda: shard(range(13), 3, 1, 2))
    check_resume_from_every_step(lambda: IterableWrapper(range(4)).sharding_filter())


def test_sharding_group_filter_is_accepted_only_when_it_changes_nothing():
    from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES

    source = IterableWrapper(range(4))
    assert isinstance(source.sharding_filter(SHARDING_PRIORITIES.DEFAULT), ShardingFilter)
    for group in (SHARDING_PRIORITIES.DISTRIBUTED, SHARDING_PRIORITIES.MULTIPROCESSING):
        with pytest.raises(ValueError, match="splits the data across ranks and worker processes"):
            source.sharding_filter(sharding_group_filter=group)
