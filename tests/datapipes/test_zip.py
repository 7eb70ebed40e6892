"""Tests for Zipper (iter) and MapZipper (map)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import (
    IterableWrapper,
    MapDataPipe,
    MapZipper,
    NotAvailable,
    SequenceWrapper,
    Zipper,
    reset_pipeline,
)
from pipeloom.events import Signal
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.helpers import Flaky, drain_retrying
from tests.strategies import item_lists


@settings(max_examples=50, deadline=None)
@given(lists=st.lists(item_lists, min_size=1, max_size=4))
def test_zip_matches_builtin_zip(lists):
    dp = Zipper(*(IterableWrapper(x) for x in lists))
    assert list(dp) == list(zip(*lists))
    assert len(dp) == min(len(x) for x in lists)


def test_functional_form_and_repr():
    dp = IterableWrapper("abc").zip(IterableWrapper(range(2)))
    assert list(dp) == [("a", 0), ("b", 1)]
    assert repr(dp) == "Zipper()"


def test_partial_tuple_survives_not_available():
    def make():
        return Flaky(range(20), seed=1).zip(Flaky(range(100, 118), seed=2), Flaky("x" * 25, seed=3))

    expected = list(zip(range(20), range(100, 118), "x" * 25))
    assert drain_retrying(make()) == expected
    assert collect_async(make()) == expected


def test_stop_iteration_repeats_until_reset():
    dp = IterableWrapper([1]).zip(IterableWrapper([2, 3]))
    reset_pipeline(dp)
    assert dp.async_next() == (1, 2)
    for _ in range(2):
        with pytest.raises(StopIteration):
            dp.async_next()


def test_non_iter_inputs_are_rejected_naming_the_argument():
    with pytest.raises(
        TypeError,
        match=r"zip\(\) argument 2 must be an IterDataPipe, got SequenceWrapper; "
        r"SequenceWrapper is a MapDataPipe; convert it with \.to_iter\(\)",
    ):
        IterableWrapper([1]).zip(SequenceWrapper([1]))
    with pytest.raises(TypeError, match=r"argument 3 must be an IterDataPipe, got list; wrap it"):
        Zipper(IterableWrapper([1]), IterableWrapper([1]), [1])
    with pytest.raises(ValueError, match=r"zip\(\) needs at least one input block"):
        Zipper()


def test_resume_from_every_step():
    check_resume_from_every_step(
        lambda: IterableWrapper(range(7)).zip(Flaky(range(10, 19)), IterableWrapper("abcdefgh"))
    )


class SlowMap(MapDataPipe):
    """Each index is ready on its second request."""

    def __init__(self, n, scale):
        self.n, self.scale = n, scale
        self.requested: set[int] = set()
        self.signal = Signal()

    def async_get(self, index):
        if index not in self.requested:
            self.requested.add(index)
            self.signal.fire()
            raise NotAvailable
        return index * self.scale

    def __len__(self):
        return self.n

    def readiness_sources(self):
        return [self.signal]


def test_map_zip_indexes_every_input_and_has_the_shortest_length():
    dp = SequenceWrapper("abcd").zip(SequenceWrapper([1, 2, 3]))
    assert isinstance(dp, MapZipper)
    assert len(dp) == 3
    assert [dp[i] for i in range(3)] == [("a", 1), ("b", 2), ("c", 3)]
    with pytest.raises(IndexError, match="out of range"):
        dp[3]
    assert repr(dp) == "MapZipper()"


def test_map_zip_requests_every_input_before_raising_not_available():
    a, b = SlowMap(5, 1), SlowMap(5, 10)
    dp = MapZipper(a, b)
    with pytest.raises(NotAvailable):
        dp.async_get(2)
    assert a.requested == {2} and b.requested == {2}
    assert dp.async_get(2) == (2, 20)
    assert collect(dp.to_iter()) == [(i, i * 10) for i in range(5)]
    pipe = MapZipper(SlowMap(4, 1), SlowMap(5, 2)).to_iter()
    assert collect_async(pipe) == [(i, 2 * i) for i in range(4)]


def test_map_zip_rejects_iter_inputs():
    match = r"zip\(\) argument 2 must be a MapDataPipe, got IterableWrapper"
    with pytest.raises(TypeError, match=match):
        MapZipper(SequenceWrapper([1]), IterableWrapper([1]))
