"""Tests for Multiplexer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import (
    IterableWrapper,
    IterDataPipe,
    Multiplexer,
    SequenceWrapper,
    current_position,
    reset_pipeline,
)
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.helpers import Flaky, drain_retrying
from tests.strategies import item_lists


class WithPosition(IterDataPipe):
    inputs = ("source",)

    def __init__(self, source):
        self.source = source

    def async_next(self):
        item = self.source.async_next()
        return item, current_position()

    def state_dict(self):
        return {}


def test_matches_torchdata_example():
    dp1, dp2, dp3 = (IterableWrapper(range(n, n + k)) for n, k in ((0, 3), (10, 5), (20, 5)))
    dp = dp1.mux(dp2, dp3)
    assert list(dp) == [0, 10, 20, 1, 11, 21, 2, 12, 22]
    assert len(dp) == 9
    assert repr(dp) == "Multiplexer()"


@settings(max_examples=50, deadline=None)
@given(lists=st.lists(item_lists, min_size=1, max_size=4))
def test_yields_complete_rounds_until_the_shortest_is_exhausted(lists):
    dp = Multiplexer(*(IterableWrapper(x) for x in lists))
    expected = [x for round_ in zip(*lists) for x in round_]
    assert list(dp) == expected
    assert len(dp) == len(expected)


def test_each_item_keeps_its_own_stamp():
    dp = WithPosition(IterableWrapper("abc").mux(IterableWrapper("xyz")))
    assert collect(dp) == [("a", 0), ("x", 0), ("b", 1), ("y", 1), ("c", 2), ("z", 2)]


def test_retrying_after_not_available_and_async_path():
    def make():
        return Flaky(range(6), seed=1).mux(Flaky(range(10, 17), seed=2))

    expected = [0, 10, 1, 11, 2, 12, 3, 13, 4, 14, 5, 15]
    assert drain_retrying(make()) == expected
    assert collect_async(make()) == expected


def test_stop_iteration_repeats_until_reset():
    dp = IterableWrapper([1]).mux(IterableWrapper([]))
    reset_pipeline(dp)
    for _ in range(2):
        with pytest.raises(StopIteration):
            dp.async_next()


def test_non_iter_inputs_are_rejected():
    match = r"mux\(\) argument 2 must be an IterDataPipe, got SequenceWrapper"
    with pytest.raises(TypeError, match=match):
        IterableWrapper([1]).mux(SequenceWrapper([1]))


def test_resume_from_every_step():
    check_resume_from_every_step(
        lambda: Flaky(range(5)).mux(IterableWrapper(range(10, 17)), IterableWrapper("abcdef"))
    )
