"""Tests of ``flatmap`` (FlatMapper)."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeloom.datapipes import (
    FlatMapper,
    IterableWrapper,
    current_position,
    load_pipeline_state_dict,
    pipeline_state_dict,
    reset_pipeline,
)
from pipeloom.testing import (
    check_resume_from_every_step,
    check_same_output_everywhere,
    collect,
    collect_async,
)
from tests.datapipes.helpers import Stutter, drive
from tests.strategies import item_lists


def repeat(x):
    return [x] * (abs(x) % 4)


def test_flatmap_yields_the_elements_of_each_result():
    assert list(IterableWrapper([1, 2, 3]).flatmap(repeat)) == [1, 2, 2, 3, 3, 3]


def test_without_fn_each_item_is_flattened():
    assert list(IterableWrapper([[1, 2], [], (3,)]).flatmap()) == [1, 2, 3]


def test_input_col_selects_what_is_expanded():
    assert list(IterableWrapper([("a", [1, 2])]).flatmap(input_col=1)) == [1, 2]
    assert list(
        IterableWrapper([(2, 3)]).flatmap(lambda a, b: range(a, b + 1), input_col=[0, 1])
    ) == [2, 3]


def test_generator_results_are_consumed_lazily():
    def gen(x):
        yield x
        yield -x

    assert list(IterableWrapper([1, 2]).flatmap(gen)) == [1, -1, 2, -2]


def test_non_iterable_result_is_a_noted_type_error():
    with pytest.raises(TypeError) as info:
        list(IterableWrapper([1]).flatmap(lambda x: x))
    assert any("FlatMapper(" in note for note in info.value.__notes__)


def test_error_inside_a_generator_result_is_noted():
    def gen(x):
        yield x
        raise KeyError(x)

    with pytest.raises(KeyError) as info:
        list(IterableWrapper([7]).flatmap(gen))
    assert any("position 0" in note for note in info.value.__notes__)


def test_each_element_carries_the_position_of_its_item():
    dp = IterableWrapper([1, 2, 3]).flatmap(repeat).map(lambda x: (x, current_position()))
    assert list(dp) == [(1, 0), (2, 1), (2, 1), (3, 2), (3, 2), (3, 2)]


def test_non_callable_fn_is_a_type_error():
    with pytest.raises(TypeError, match="expects fn to be a callable"):
        IterableWrapper([1]).flatmap(5)


def test_repr():
    assert repr(IterableWrapper([1]).flatmap(repeat)) == "FlatMapper(fn=repeat)"
    assert repr(FlatMapper(IterableWrapper([1]), input_col=0)) == "FlatMapper(fn=None, input_col=0)"


def test_resume_in_the_middle_of_a_generator_result():
    def gen(x):
        yield from range(x)

    check_resume_from_every_step(lambda: Stutter(IterableWrapper([3, 0, 2, 4])).flatmap(gen))


def test_a_pipeline_mid_item_can_be_pickled_and_continues():
    dp = IterableWrapper([3, 2]).flatmap(lambda x: (x for _ in range(x)))
    reset_pipeline(dp)
    assert dp.async_next() == 3
    state = pipeline_state_dict(dp)
    clone = pickle.loads(pickle.dumps(state))
    fresh = IterableWrapper([3, 2]).flatmap(repeat)
    reset_pipeline(fresh)
    load_pipeline_state_dict(fresh, clone)
    assert [fresh.async_next() for _ in range(4)] == [3, 3, 2, 2]


def test_not_available_between_items_loses_nothing():
    items, stalls = drive(Stutter(IterableWrapper(range(30))).flatmap(repeat))
    assert items == [y for x in range(30) for y in repeat(x)] and stalls > 0


@given(item_lists, st.integers(0, 2**16))
def test_matches_a_nested_comprehension_sync_and_async(items, seed):
    def make():
        return Stutter(IterableWrapper(items), seed=seed).flatmap(repeat)

    assert collect(make()) == collect_async(make()) == [y for x in items for y in repeat(x)]


@pytest.mark.timeout(120)
def test_same_items_and_stamps_under_every_service_that_takes_a_flatmap():
    ran = check_same_output_everywhere(
        lambda: IterableWrapper(range(12)).sharding_filter().flatmap(repeat).batch(4)
    )
    assert ran == ["in-process", "threads", "classic", "chunked"]  # economic refuses a flatmap
