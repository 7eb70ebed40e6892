"""Dropper (drop), Slicer (slice) and Flattener (flatten): columns inside items."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeloom.datapipes import Dropper, Flattener, IterableWrapper, Slicer
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere

ROWS = [(0, 10, (100, 1000)), (1, 11, (111, 1001)), (2, 12, (122, 1002))]


def test_drop_positions_and_keys():
    assert list(IterableWrapper(ROWS).drop(1)) == [
        (0, (100, 1000)),
        (1, (111, 1001)),
        (2, (122, 1002)),
    ]
    assert list(IterableWrapper([[1, 2, 3]]).drop([0, -1])) == [[2]]
    assert list(IterableWrapper([{"a": 1, "b": 2}]).drop("a")) == [{"b": 2}]


def test_slice_ranges_lists_and_dict_keys():
    assert list(IterableWrapper(ROWS).slice(0, 2)) == [(0, 10), (1, 11), (2, 12)]
    assert list(IterableWrapper(ROWS).slice(1)) == [
        (10, (100, 1000)),
        (11, (111, 1001)),
        (12, (122, 1002)),
    ]
    assert list(IterableWrapper([[0, 1, 2, 3]]).slice([3, 0])) == [[0, 3]]
    assert list(IterableWrapper([{"a": 1, "b": 2}]).slice("b")) == [{"b": 2}]


def test_flatten_all_or_chosen_columns_one_level():
    assert list(IterableWrapper(ROWS).flatten(2))[0] == (0, 10, 100, 1000)
    assert list(IterableWrapper([[0, [1, [2]]], (3, (4,))]).flatten()) == [[0, 1, [2]], (3, 4)]
    nested = {"id": 1, "size": {"w": 2, "h": 3}, "tags": {"x": 1}}
    assert list(IterableWrapper([nested]).flatten()) == [{"id": 1, "w": 2, "h": 3, "x": 1}]
    assert list(IterableWrapper([nested]).flatten(["size"])) == [
        {"id": 1, "w": 2, "h": 3, "tags": {"x": 1}}
    ]


@given(st.lists(st.integers(), min_size=1, max_size=8), st.data())
def test_drop_and_slice_by_positions_match_python(values, data):
    chosen = data.draw(st.sets(st.integers(0, len(values) - 1)))
    kept = [v for i, v in enumerate(values) if i not in chosen]
    assert list(IterableWrapper([tuple(values)]).drop(sorted(chosen))) == [tuple(kept)]
    start = data.draw(st.integers(-len(values), len(values)))
    step = data.draw(st.sampled_from([None, 1, 2, -1]))
    assert list(IterableWrapper([values]).slice(start, None, step)) == [values[start::step]]


def test_missing_columns_and_wrong_items_are_errors_that_name_them():
    with pytest.raises(IndexError, match="the item has 3 columns, so there is no column 5"):
        list(IterableWrapper(ROWS).drop(5))
    with pytest.raises(KeyError, match="the item has no key 'z'"):
        list(IterableWrapper([{"a": 1}]).slice("z"))
    with pytest.raises(KeyError, match=r"flatten\(\): the item has no key 'q'"):
        list(IterableWrapper([{"a": 1}]).flatten("q"))
    with pytest.raises(TypeError, match=r"drop\(\) works on tuple, list or dict items, got int"):
        list(IterableWrapper([3]).drop(0))
    with pytest.raises(TypeError, match="has columns by position, got the column 'a'"):
        list(IterableWrapper([(1, 2)]).drop("a"))
    with pytest.raises(ValueError, match=r"the key 'w' of column 'size' already exists"):
        list(IterableWrapper([{"w": 0, "size": {"w": 2}}]).flatten())
    with pytest.raises(ValueError, match="pass either the columns to keep, or start/stop/step"):
        IterableWrapper([]).slice([0, 1], stop=3)
    with pytest.raises(ValueError, match="step must not be zero"):
        IterableWrapper([]).slice(0, 3, 0)
    with pytest.raises(TypeError, match=r"expects column indices or keys \(hashable\)"):
        IterableWrapper([]).drop([[1]])


def test_lengths_and_reprs():
    source = IterableWrapper(ROWS)
    assert len(source.drop(0)) == len(source.slice(1)) == len(source.flatten()) == 3
    assert repr(Dropper(source, [1])) == "Dropper(indices=[1])"
    assert repr(Slicer(source, 0, 2)) == "Slicer(index=0, stop=2, step=None)"
    assert repr(Flattener(source)) == "Flattener(indices=None)"


def test_resume_from_every_step():
    check_resume_from_every_step(lambda: IterableWrapper(ROWS).flatten(2).drop(0).slice(0, 2))


def test_same_output_everywhere():
    epochs = check_same_output_everywhere(
        lambda: (
            IterableWrapper(ROWS * 3).shuffle().sharding_filter().flatten().slice([0, 3]).drop(1)
        )
    )
    assert sorted(epochs[0]) == sorted([(0,), (1,), (2,)] * 3)
