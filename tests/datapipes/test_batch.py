"""Tests of ``batch`` / ``unbatch`` (Batcher, Unbatcher, MapBatcher)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeloom.datapipes import (
    Batcher,
    IterableWrapper,
    IterDataPipe,
    MapBatcher,
    MapDataPipe,
    NotAvailable,
    SequenceWrapper,
    Unbatcher,
    reset_pipeline,
)
from pipeloom.events import Signal
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.helpers import Stutter, drive
from tests.strategies import item_lists, positive_sizes


class OldStyleSource(IterDataPipe):
    """A source written the simple way: only a generator ``__iter__``."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        yield from self.items

    def state_dict(self):
        return {}


# -- Batcher ---------------------------------------------------------------------


def test_batch_groups_consecutive_items_and_keeps_the_short_last_batch():
    assert list(IterableWrapper(range(7)).batch(3)) == [[0, 1, 2], [3, 4, 5], [6]]


def test_drop_last_discards_the_short_final_batch():
    assert list(IterableWrapper(range(7)).batch(3, drop_last=True)) == [[0, 1, 2], [3, 4, 5]]


def test_wrapper_class_wraps_each_batch():
    assert list(IterableWrapper(range(3)).batch(2, wrapper_class=tuple)) == [(0, 1), (2,)]


@pytest.mark.parametrize(
    "n, drop_last, expected", [(7, False, 3), (7, True, 2), (6, True, 2), (0, False, 0)]
)
def test_len_is_ceil_or_floor(n, drop_last, expected):
    assert len(IterableWrapper(range(n)).batch(3, drop_last=drop_last)) == expected


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_bad_batch_size_is_a_value_error(bad):
    with pytest.raises(
        ValueError, match="batch_size must be an int >= 1, got .*; use batch_size=1"
    ):
        IterableWrapper([1]).batch(bad)


def test_bad_drop_last_and_wrapper_class_are_type_errors():
    with pytest.raises(
        TypeError, match="drop_last must be a bool, got str 'yes'; pass True or False"
    ):
        IterableWrapper([1]).batch(2, drop_last="yes")
    with pytest.raises(TypeError, match="wrapper_class to be a callable"):
        IterableWrapper([1]).batch(2, wrapper_class=3)


def test_repr_shows_the_arguments():
    assert repr(IterableWrapper([1]).batch(4)) == "Batcher(batch_size=4, drop_last=False)"
    assert (
        repr(IterableWrapper([1]).batch(2, True, tuple))
        == "Batcher(batch_size=2, drop_last=True, wrapper_class=tuple)"
    )


def test_stream_keeps_ending_after_the_last_batch():
    dp = IterableWrapper(range(3)).batch(2)
    reset_pipeline(dp)
    assert [dp.async_next(), dp.async_next()] == [[0, 1], [2]]
    for _ in range(2):
        with pytest.raises(StopIteration):
            dp.async_next()


def test_not_available_in_the_middle_of_a_batch_keeps_the_partial_batch():
    items, stalls = drive(Stutter(IterableWrapper(range(25)), rate=0.6).batch(4))
    assert items == [list(range(i, min(i + 4, 25))) for i in range(0, 25, 4)] and stalls > 5


def test_resume_from_every_step_with_partial_batches():
    check_resume_from_every_step(lambda: Stutter(IterableWrapper(range(11))).batch(3))
    check_resume_from_every_step(lambda: IterableWrapper(range(11)).batch(3, drop_last=True))


def test_old_style_source_feeds_batch():
    assert collect_async(OldStyleSource(range(5)).batch(2)) == [[0, 1], [2, 3], [4]]


@given(item_lists, positive_sizes, st.booleans())
def test_batch_sizes_are_batch_size_except_maybe_the_last(items, size, drop_last):
    batches = collect(IterableWrapper(items).batch(size, drop_last=drop_last))
    assert all(len(b) == size for b in batches[:-1])
    if batches:
        assert 1 <= len(batches[-1]) <= size
    if drop_last:
        assert sum(map(len, batches)) == len(items) - len(items) % size
        assert all(len(b) == size for b in batches)
    assert len(batches) == len(IterableWrapper(items).batch(size, drop_last=drop_last))


@given(item_lists, positive_sizes, st.integers(0, 2**16))
def test_batch_then_unbatch_is_the_identity_sync_and_async(items, size, seed):
    def make():
        return Stutter(IterableWrapper(items), seed=seed).batch(size).unbatch()

    assert collect(make()) == collect_async(make()) == items


# -- Unbatcher ---------------------------------------------------------------------


def test_unbatch_levels():
    nested = [[[0, 1], [2]], [[3]]]
    assert list(IterableWrapper(nested).unbatch()) == [[0, 1], [2], [3]]
    assert list(IterableWrapper(nested).unbatch(unbatch_level=2)) == [0, 1, 2, 3]
    assert list(IterableWrapper(nested).unbatch(unbatch_level=0)) == nested


def test_unbatch_all_flattens_lists_but_keeps_tuples_like_torchdata():
    assert list(IterableWrapper([[[1, [2]], (3, 4)], 5]).unbatch(-1)) == [1, 2, (3, 4), 5]


def test_unbatch_accepts_tuple_batches_at_explicit_levels():
    assert list(IterableWrapper(range(5)).batch(2, wrapper_class=tuple).unbatch()) == list(range(5))


def test_unbatch_deeper_than_the_data_names_the_level():
    with pytest.raises(
        IndexError, match="unbatch_level=2 exceeds the depth .* at level 2 found int 1"
    ):
        list(IterableWrapper([[1, 2]]).unbatch(unbatch_level=2))
    with pytest.raises(IndexError, match="at level 1 found str"):
        list(IterableWrapper(["ab"]).unbatch())


@pytest.mark.parametrize("bad", [-2, 1.5, "1", None])
def test_bad_unbatch_level_is_a_value_error(bad):
    with pytest.raises(ValueError, match="unbatch_level must be an int >= -1"):
        IterableWrapper([1]).unbatch(unbatch_level=bad)


def test_unbatch_skips_empty_batches_and_has_a_repr():
    dp = IterableWrapper([[], [1], [], [2, 3], []]).unbatch()
    assert list(dp) == [1, 2, 3]
    assert repr(dp) == "Unbatcher(unbatch_level=1)"
    assert type(dp) is Unbatcher and type(IterableWrapper([1]).batch(1)) is Batcher


def test_unbatch_resumes_inside_a_batch():
    check_resume_from_every_step(
        lambda: Stutter(IterableWrapper([[0, 1, 2], [], [3, 4]])).unbatch()
    )
    check_resume_from_every_step(lambda: IterableWrapper([[[0, 1], [2]], [[3]]]).unbatch(2))


# -- MapBatcher ---------------------------------------------------------------------


class SlowMap(MapDataPipe):
    """Test map-style upstream: an index is NotAvailable the first time it is asked for."""

    def __init__(self, n):
        self.n, self.asked, self.signal = n, [], Signal()

    def async_get(self, index):
        if index not in self.asked:
            self.asked.append(index)
            self.signal.fire()
            raise NotAvailable
        return index * 10

    def __len__(self):
        return self.n

    def readiness_sources(self):
        return (self.signal,)


def test_map_batcher_indexes_batches():
    dp = SequenceWrapper(range(7)).batch(3)
    assert [dp[i] for i in range(len(dp))] == [[0, 1, 2], [3, 4, 5], [6]]
    assert dp[-1] == [6]
    assert len(SequenceWrapper(range(7)).batch(3, drop_last=True)) == 2


def test_map_batcher_out_of_range_is_an_index_error():
    with pytest.raises(IndexError, match="batch index 2 is out of range for 2 batches"):
        SequenceWrapper(range(7)).batch(3, drop_last=True)[2]


def test_map_batcher_requests_every_item_before_waiting():
    source = SlowMap(5)
    dp = MapBatcher(source, 3)
    with pytest.raises(NotAvailable):
        dp.async_get(0)
    assert source.asked == [0, 1, 2]
    assert dp.async_get(0) == [0, 10, 20]
    assert dp[1] == [30, 40]
    assert repr(dp) == "MapBatcher(batch_size=3, drop_last=False)"


def test_map_batcher_iterates_through_to_iter_with_waits():
    assert collect_async(MapBatcher(SlowMap(5), 2, wrapper_class=tuple).to_iter()) == [
        (0, 10),
        (20, 30),
        (40,),
    ]


@given(item_lists, positive_sizes, st.booleans())
def test_map_batcher_agrees_with_the_iterable_batcher(items, size, drop_last):
    mapped = SequenceWrapper(items).batch(size, drop_last=drop_last)
    assert list(mapped.to_iter()) == collect(
        IterableWrapper(items).batch(size, drop_last=drop_last)
    )
