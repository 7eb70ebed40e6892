"""Tests of ``header`` (Header)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeloom.datapipes import Header, IterableWrapper, IterDataPipe, reset_pipeline
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.strategies import item_lists


class Counting(IterDataPipe):
    """Counts how many items were pulled from it."""

    inputs = ("source",)

    def __init__(self, source):
        self.source, self.pulled = source, 0

    def async_next(self):
        item = self.source.async_next()
        self.pulled += 1
        return item

    def state_dict(self):
        return {}


def test_header_yields_the_first_limit_items():
    assert list(IterableWrapper(range(100)).header(3)) == [0, 1, 2]
    assert list(IterableWrapper(range(2)).header(3)) == [0, 1]
    assert list(IterableWrapper(range(4)).header()) == [0, 1, 2, 3]


def test_limit_none_yields_everything_and_zero_nothing():
    assert list(IterableWrapper(range(20)).header(None)) == list(range(20))
    assert list(IterableWrapper(range(20)).header(0)) == []


def test_header_does_not_pull_more_than_limit_items():
    counting = Counting(IterableWrapper(range(100)))
    dp = counting.header(5)
    reset_pipeline(dp)
    assert [dp.async_next() for _ in range(5)] == list(range(5))
    with pytest.raises(StopIteration):
        dp.async_next()
    assert counting.pulled == 5


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_bad_limit_is_a_value_error(bad):
    with pytest.raises(ValueError, match="limit must be an int >= 0 or None"):
        IterableWrapper([]).header(bad)


def test_len_is_the_smaller_of_limit_and_the_source_length():
    assert len(IterableWrapper(range(100)).header(3)) == 3
    assert len(IterableWrapper(range(2)).header(3)) == 2
    assert len(IterableWrapper(range(2)).header(None)) == 2


def test_len_without_a_source_length_is_a_type_error():
    with pytest.raises(TypeError, match="limit is only an upper bound"):
        len(IterableWrapper(range(9)).filter(bool).header(3))


def test_repr_and_type():
    dp = IterableWrapper([]).header(4)
    assert repr(dp) == "Header(limit=4)" and type(dp) is Header


def test_resume_from_every_step():
    check_resume_from_every_step(lambda: IterableWrapper(range(10)).header(6))


@given(item_lists, st.one_of(st.none(), st.integers(0, 70)))
def test_matches_slicing_sync_and_async(items, limit):
    def make():
        return IterableWrapper(items).header(limit)

    assert collect(make()) == collect_async(make()) == items[:limit]
