"""Tests of ``filter`` (Filter)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pipeloom.datapipes import Filter, IterableWrapper, item_rng
from pipeloom.testing import (
    check_resume_from_every_step,
    check_same_output_everywhere,
    collect,
    collect_async,
)
from tests.datapipes.helpers import Stutter, drive
from tests.strategies import item_lists


def is_even(x):
    return x % 2 == 0


def test_filter_keeps_items_where_the_predicate_is_true():
    assert list(IterableWrapper(range(10)).filter(is_even)) == [0, 2, 4, 6, 8]


def test_input_col_tests_a_column_but_keeps_the_whole_item():
    items = [(1, "a"), (2, "b"), (3, "c")]
    assert list(IterableWrapper(items).filter(is_even, input_col=0)) == [(2, "b")]


def test_several_input_cols_are_positional_args():
    items = [{"a": 1, "b": 1}, {"a": 1, "b": 2}]
    assert (
        list(IterableWrapper(items).filter(lambda a, b: a == b, input_col=["a", "b"])) == items[:1]
    )


def test_numpy_and_tensor_booleans_are_accepted():
    assert list(IterableWrapper(range(4)).filter(lambda x: np.bool_(x > 1))) == [2, 3]
    assert list(IterableWrapper(range(4)).filter(lambda x: torch.tensor(x > 2))) == [3]


@pytest.mark.parametrize("bad", [1, None, "yes", [1]])
def test_a_non_bool_result_is_a_value_error_like_torchdata(bad):
    with pytest.raises(ValueError, match="must return a bool, got .* at position 0"):
        list(IterableWrapper([5]).filter(lambda x: bad))


def test_non_callable_filter_fn_is_a_type_error():
    with pytest.raises(TypeError, match="expects filter_fn to be a callable"):
        IterableWrapper([1]).filter("x")


def test_predicate_errors_are_noted_with_block_and_position():
    with pytest.raises(ZeroDivisionError) as info:
        list(IterableWrapper([1, 0]).filter(lambda x: 1 / x > 0))
    assert any("Filter(" in n and "position 1" in n for n in info.value.__notes__)


def test_repr_shows_the_arguments():
    assert (
        repr(IterableWrapper([1]).filter(is_even, input_col=0))
        == "Filter(filter_fn=is_even, input_col=0)"
    )
    assert repr(IterableWrapper([1]).filter(is_even)) == "Filter(filter_fn=is_even)"
    assert type(IterableWrapper([1]).filter(is_even)) is Filter


def test_filter_has_no_length():
    with pytest.raises(TypeError):
        len(IterableWrapper([1]).filter(is_even))


def test_resume_from_every_step():
    check_resume_from_every_step(lambda: Stutter(IterableWrapper(range(20))).filter(is_even))


def test_not_available_mid_scan_loses_nothing():
    items, stalls = drive(Stutter(IterableWrapper(range(60)), rate=0.7).filter(is_even))
    assert items == list(range(0, 60, 2)) and stalls > 0


@given(item_lists, st.integers(0, 2**16))
def test_matches_a_list_comprehension_sync_and_async(items, seed):
    def make():
        return Stutter(IterableWrapper(items), seed=seed).filter(is_even)

    expected = [x for x in items if is_even(x)]
    assert collect(make()) == collect_async(make()) == expected


def keep_most(x):
    return item_rng().random() < 0.7


@pytest.mark.timeout(120)
def test_same_items_under_every_service_that_takes_a_filter():
    ran = check_same_output_everywhere(
        lambda: IterableWrapper(range(16)).sharding_filter().filter(keep_most).batch(3)
    )
    assert ran == ["in-process", "threads", "classic", "chunked"]  # economic refuses a filter
