"""Tests of ``enumerate`` (Enumerator)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeloom.datapipes import Enumerator, IterableWrapper
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.strategies import item_lists


def test_enumerate_pairs_each_item_with_its_index():
    assert list(IterableWrapper("abc").enumerate()) == [(0, "a"), (1, "b"), (2, "c")]


def test_starting_index_and_restart_each_epoch():
    dp = IterableWrapper("ab").enumerate(starting_index=-1)
    assert list(dp) == list(dp) == [(-1, "a"), (0, "b")]


def test_bad_starting_index_is_a_type_error():
    with pytest.raises(TypeError, match="starting_index must be an int, got str"):
        IterableWrapper([]).enumerate("1")


def test_len_repr_and_type():
    dp = IterableWrapper(range(4)).enumerate(2)
    assert len(dp) == 4 and repr(dp) == "Enumerator(starting_index=2)" and type(dp) is Enumerator


def test_resume_from_every_step():
    check_resume_from_every_step(lambda: IterableWrapper(range(8)).enumerate(3))


@given(item_lists, st.integers(-5, 5))
def test_matches_builtin_enumerate_sync_and_async(items, start):
    def make():
        return IterableWrapper(items).enumerate(start)

    assert collect(make()) == collect_async(make()) == list(enumerate(items, start))
