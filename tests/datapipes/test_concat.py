"""Tests for Concater (iter) and MapConcater (map)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import Concater, IterableWrapper, MapConcater, SequenceWrapper
from pipeloom.testing import check_resume_from_every_step, collect_async
from tests.datapipes.helpers import Flaky, drain_retrying
from tests.strategies import item_lists


@settings(max_examples=50, deadline=None)
@given(lists=st.lists(item_lists, min_size=1, max_size=4))
def test_concat_yields_each_stream_in_turn(lists):
    dp = Concater(*(IterableWrapper(x) for x in lists))
    flat = [x for part in lists for x in part]
    assert list(dp) == flat
    assert len(dp) == len(flat)


@settings(max_examples=50, deadline=None)
@given(lists=st.lists(item_lists, min_size=1, max_size=4))
def test_map_concat_indexes_across_inputs(lists):
    dp = MapConcater(*(SequenceWrapper(x) for x in lists))
    flat = [x for part in lists for x in part]
    assert len(dp) == len(flat)
    assert [dp[i] for i in range(len(dp))] == flat


def test_functional_forms_and_repr():
    dp = IterableWrapper([1]).concat(IterableWrapper([2, 3]))
    assert list(dp) == [1, 2, 3] and repr(dp) == "Concater()"
    mdp = SequenceWrapper("ab").concat(SequenceWrapper("c"))
    assert isinstance(mdp, MapConcater) and list(mdp) == ["a", "b", "c"]
    assert repr(mdp) == "MapConcater()"


def test_map_concat_rejects_out_of_range_indices():
    dp = SequenceWrapper("ab").concat(SequenceWrapper("c"))
    for index in (3, -1):
        match = f"index {index} is out of range for MapConcater of length 3"
        with pytest.raises(IndexError, match=match):
            dp[index]


def test_mixed_kinds_are_rejected():
    match = r"concat\(\) argument 2 must be an IterDataPipe, got SequenceWrapper"
    with pytest.raises(TypeError, match=match):
        IterableWrapper([1]).concat(SequenceWrapper([2]))
    match = r"concat\(\) argument 2 must be a MapDataPipe, got IterableWrapper"
    with pytest.raises(TypeError, match=match):
        SequenceWrapper([1]).concat(IterableWrapper([2]))


def test_retrying_after_not_available_and_async_path():
    def make():
        return Flaky(range(5), seed=1).concat(Flaky(range(5, 9), seed=2))

    assert drain_retrying(make()) == list(range(9))
    assert collect_async(make()) == list(range(9))


def test_resume_from_every_step():
    check_resume_from_every_step(
        lambda: IterableWrapper(range(3)).concat(IterableWrapper([]), Flaky(range(3, 7)))
    )
