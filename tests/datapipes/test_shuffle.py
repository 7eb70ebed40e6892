"""Tests for Shuffler (iter) and MapShuffler (map -> iter)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from pipeloom.datapipes import (
    IterableWrapper,
    IterDataPipe,
    MapDataPipe,
    MapShuffler,
    NotAvailable,
    SequenceWrapper,
    Shuffler,
    current_position,
    reset_pipeline,
    seed_pipeline,
    set_pipeline_epoch,
)
from pipeloom.events import Signal
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.helpers import Flaky, drain_retrying
from tests.strategies import item_lists, positive_sizes, seeds


class WithPosition(IterDataPipe):
    """Pairs each item with the position stamped on it."""

    inputs = ("source",)

    def __init__(self, source):
        self.source = source

    def async_next(self):
        item = self.source.async_next()
        return item, current_position()

    def state_dict(self):
        return {}


@settings(max_examples=60, deadline=None)
@given(items=item_lists, buffer_size=positive_sizes, seed=seeds)
def test_output_is_a_permutation_of_the_input(items, buffer_size, seed):
    dp = IterableWrapper(items).shuffle(buffer_size=buffer_size, seed=seed)
    assert isinstance(dp, Shuffler)
    assert sorted(list(dp)) == sorted(items)


def test_same_seed_and_epoch_give_the_same_order_and_a_new_epoch_a_new_one():
    dp = IterableWrapper(range(100)).shuffle(buffer_size=30)
    first = collect(dp, seed=7, epoch=0)
    assert collect(dp, seed=7, epoch=0) == first
    assert collect(dp, seed=7, epoch=1) != first
    assert first != list(range(100))


def test_own_seed_is_kept_when_the_pipeline_is_seeded():
    dp = IterableWrapper(range(50)).shuffle(seed=3)
    assert collect(dp, seed=1) == collect(dp, seed=2)


def test_without_a_seed_the_order_follows_torch_manual_seed():
    dp = IterableWrapper(range(50)).shuffle()
    torch.manual_seed(11)
    first = list(dp)
    torch.manual_seed(11)
    assert list(dp) == first


def test_buffer_size_one_keeps_the_order():
    assert collect(IterableWrapper(range(10)).shuffle(buffer_size=1)) == list(range(10))


def test_invalid_buffer_size_is_rejected_with_a_clear_message():
    with pytest.raises(ValueError, match=r"buffer_size must be an int >= 1, got -1; "):
        IterableWrapper([1]).shuffle(buffer_size=-1)
    with pytest.raises(ValueError, match="got 2.5"):
        IterableWrapper([1]).shuffle(buffer_size=2.5)
    with pytest.raises(TypeError, match="seed must be an int"):
        IterableWrapper([1]).shuffle(seed="x")


def test_len_and_repr():
    dp = IterableWrapper(range(9)).shuffle(buffer_size=4, seed=2)
    assert len(dp) == 9
    assert repr(dp) == "Shuffler(buffer_size=4, seed=2)"


def test_retrying_after_not_available_loses_and_repeats_nothing():
    def make():
        return Flaky(range(40), seed=5).shuffle(buffer_size=7, seed=1)

    expected = collect(IterableWrapper(range(40)).shuffle(buffer_size=7, seed=1))
    assert drain_retrying(make()) == expected
    assert collect_async(make()) == expected


def test_sync_and_async_paths_agree():
    dp = IterableWrapper(range(30)).shuffle(buffer_size=8)
    assert collect(dp, seed=4) == collect_async(dp, seed=4)


def test_items_keep_their_source_position_through_the_buffer():
    pairs = collect(WithPosition(IterableWrapper(range(25)).shuffle(buffer_size=6)))
    assert [item for item, _ in pairs] != list(range(25))
    assert all(item == position for item, position in pairs)


def test_resume_from_every_step():
    check_resume_from_every_step(lambda: IterableWrapper(range(15)).shuffle(buffer_size=4))
    check_resume_from_every_step(lambda: Flaky(range(12)).shuffle(buffer_size=20))


def test_stop_iteration_repeats_until_reset():
    dp = IterableWrapper([1, 2]).shuffle()
    reset_pipeline(dp)
    assert sorted([dp.async_next(), dp.async_next()]) == [1, 2]
    for _ in range(2):
        with pytest.raises(StopIteration):
            dp.async_next()


# -- MapShuffler ---------------------------------------------------------------


class SlowMap(MapDataPipe):
    """Map-style test block: an item is ready on the second request."""

    def __init__(self, n):
        self.n = n
        self.requested: list[int] = []
        self.signal = Signal()

    def async_get(self, index):
        if index not in self.requested:
            self.requested.append(index)
            self.signal.fire()
            raise NotAvailable
        return index * 10

    def __len__(self):
        return self.n

    def readiness_sources(self):
        return [self.signal]

    def state_dict(self):
        return {}


@settings(max_examples=40, deadline=None)
@given(items=item_lists, seed=seeds)
def test_map_shuffle_yields_a_permutation(items, seed):
    dp = SequenceWrapper(items).shuffle(seed=seed)
    assert isinstance(dp, MapShuffler)
    assert sorted(dp) == sorted(items)
    assert len(dp) == len(items)


def test_map_shuffle_is_seeded_per_epoch():
    dp = SequenceWrapper(list(range(40))).shuffle()
    first = collect(dp, seed=3)
    assert collect(dp, seed=3) == first
    assert collect(dp, seed=3, epoch=1) != first
    assert sorted(first) == list(range(40))


def test_map_shuffle_requests_ahead_when_an_item_is_not_ready():
    source = SlowMap(20)
    dp = MapShuffler(source, seed=0)
    reset_pipeline(dp)
    with pytest.raises(NotAvailable):
        dp.async_next()
    assert len(source.requested) == 1 + MapShuffler.lookahead
    out = drain_retrying(dp)
    assert sorted(out) == [i * 10 for i in range(20)]
    expected = collect(MapShuffler(SlowMap(20), seed=0))
    assert collect_async(MapShuffler(SlowMap(20), seed=0)) == expected


def test_map_shuffle_items_keep_their_index_stamp():
    pairs = collect(WithPosition(SequenceWrapper(list(range(12))).shuffle()))
    assert all(item == position for item, position in pairs)


def test_map_shuffle_resume_and_validation():
    check_resume_from_every_step(lambda: SequenceWrapper(list(range(10))).shuffle())
    with pytest.raises(TypeError, match="MapShuffler expects a MapDataPipe, got IterableWrapper"):
        MapShuffler(IterableWrapper([1]))
    assert repr(SequenceWrapper([1]).shuffle(seed=5)) == "MapShuffler(seed=5)"


def test_seed_pipeline_changes_map_shuffle_order():
    dp = SequenceWrapper(list(range(30))).shuffle()
    seed_pipeline(dp, 1)
    set_pipeline_epoch(dp, 0)
    a = list(dp)
    seed_pipeline(dp, 2)
    assert list(dp) != a


# -- torchdata 0.9's arguments --------------------------------------------------------


def test_shuffle_unbatch_level_unbatches_first():
    from pipeloom.testing import collect

    batches = IterableWrapper([[0, 1], [2, 3], [4]])
    shuffled = collect(batches.shuffle(unbatch_level=1))
    assert sorted(shuffled) == [0, 1, 2, 3, 4]
    nested = IterableWrapper([[[0, 1], [2]], [[3]]])
    assert sorted(collect(nested.shuffle(unbatch_level=2))) == [0, 1, 2, 3]


def test_map_shuffle_shuffles_the_given_indices_or_keys():
    from pipeloom.testing import collect

    table = SequenceWrapper({"a": 1, "b": 2, "c": 3})
    dp = table.shuffle(indices=["a", "b", "c"])
    assert sorted(collect(dp)) == [1, 2, 3] and len(dp) == 3
    subset = SequenceWrapper(range(10)).shuffle(indices=[1, 3, 5])
    assert sorted(collect(subset)) == [1, 3, 5]
    check_resume_from_every_step(lambda: SequenceWrapper(range(10)).shuffle(indices=[9, 1, 5, 7]))
    with pytest.raises(TypeError, match="indices must be a list of indices or keys"):
        table.shuffle(indices="abc")
