"""Rows2Columnar (rows2columnar): batches of rows into dicts of columns."""

from __future__ import annotations

from collections import defaultdict

import pytest

from pipeloom.datapipes import IterableWrapper, Rows2Columnar
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere


def test_dict_rows_keep_every_key_or_the_named_ones():
    batches = IterableWrapper(
        [[{"a": 1}, {"b": 2, "a": 1}], [{"a": 1, "b": 200}, {"b": 2, "c": 3, "a": 100}]]
    )
    out = list(batches.rows2columnar())
    assert out == [{"a": [1, 1], "b": [2]}, {"a": [1, 100], "b": [200, 2], "c": [3]}]
    assert all(type(columns) is defaultdict for columns in out)
    assert list(batches.rows2columnar(column_names=["a"])) == [{"a": [1, 1]}, {"a": [1, 100]}]


def test_list_rows_are_named_by_position():
    batches = IterableWrapper([[[0, 1, 2], [4, 5, 6]]])
    assert list(batches.rows2columnar(["x", "y", "z"])) == [{"x": [0, 4], "y": [1, 5], "z": [2, 6]}]


def test_errors_say_what_is_missing():
    with pytest.raises(KeyError, match="a row has no column 'b'"):
        list(IterableWrapper([[{"a": 1}]]).rows2columnar(["b"]))
    with pytest.raises(ValueError, match="a list row has 2 values but column_names names 1"):
        list(IterableWrapper([[[1, 2]]]).rows2columnar(["a"]))
    with pytest.raises(TypeError, match="column_names must be a list of names or None"):
        IterableWrapper([]).rows2columnar("abc")


def test_length_and_repr():
    dp = IterableWrapper([[{"a": 1}]] * 3).rows2columnar(["a"])
    assert len(dp) == 3 and repr(dp) == "Rows2Columnar(column_names=['a'])"
    assert isinstance(dp, Rows2Columnar)


def test_resume_from_every_step():
    check_resume_from_every_step(
        lambda: IterableWrapper([{"a": i, "b": -i} for i in range(7)]).batch(3).rows2columnar()
    )


def test_same_output_everywhere():
    epochs = check_same_output_everywhere(
        lambda: (
            IterableWrapper([{"a": i} for i in range(10)])
            .shuffle()
            .sharding_filter()
            .batch(4)
            .rows2columnar()
        )
    )
    assert sorted(v for columns in epochs[0] for v in columns["a"]) == list(range(10))
