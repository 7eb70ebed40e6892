"""IterKeyZipper (zip_with_iter) and MapKeyZipper (zip_with_map): joins by key."""

from __future__ import annotations

from operator import itemgetter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import (
    IterableWrapper,
    IterKeyZipper,
    MapKeyZipper,
    SequenceWrapper,
    current_position,
    reset_pipeline,
)
from pipeloom.testing import check_resume_from_every_step, collect_async
from tests.datapipes.everywhere import check_same_output_everywhere
from tests.datapipes.helpers import Flaky


def first(pair):
    return pair[0]


def test_zip_with_iter_follows_the_source_order():
    source = IterableWrapper([("a", 100), ("b", 200), ("c", 300)])
    ref = IterableWrapper([("a", 1), ("b", 2), ("c", 3), ("d", 4)])
    out = source.zip_with_iter(ref, key_fn=first, keep_key=True, merge_fn=lambda x, y: x[1] + y[1])
    assert list(out) == [("a", 101), ("b", 202), ("c", 303)]
    plain = IterableWrapper([3, 1, 2]).zip_with_iter(
        IterableWrapper(["1x", "2x", "3x"]), key_fn=str, ref_key_fn=itemgetter(0)
    )
    assert list(plain) == [(3, "3x"), (1, "1x"), (2, "2x")]


@settings(max_examples=50, deadline=None)
@given(st.permutations(list(range(12))), st.permutations(list(range(12))))
def test_zip_with_iter_matches_every_key_whatever_the_orders(left, right):
    out = IterableWrapper(left).zip_with_iter(IterableWrapper(right), key_fn=lambda x: x)
    assert list(out) == [(k, k) for k in left]


def test_zip_with_iter_survives_not_available_on_both_sides():
    def make():
        return Flaky(range(10), seed=1).zip_with_iter(Flaky(range(9, -1, -1), seed=2), key_fn=int)

    assert collect_async(make()) == [(k, k) for k in range(10)]


def test_zip_with_iter_errors_and_the_full_buffer_warning():
    with pytest.raises(BufferError, match="ended without an item of key 'z'"):
        list(IterableWrapper(["z"]).zip_with_iter(IterableWrapper(["a"]), key_fn=str))
    with pytest.raises(ValueError, match="two items with key 'a'"):
        list(IterableWrapper(["b"]).zip_with_iter(IterableWrapper(["a", "a", "b"]), key_fn=str))
    dp = IterableWrapper([5, 0]).zip_with_iter(IterableWrapper(range(6)), key_fn=int, buffer_size=2)
    with pytest.warns(UserWarning, match="more than buffer_size=2 reference items wait"):
        with pytest.raises(BufferError, match="raise buffer_size"):
            list(dp)
    with pytest.raises(TypeError, match=r"use zip_with_map\(\) for a MapDataPipe"):
        IterableWrapper([]).zip_with_iter(SequenceWrapper([]), key_fn=str)
    with pytest.raises(ValueError, match="buffer_size must be an int >= 1 or None"):
        IterableWrapper([]).zip_with_iter(IterableWrapper([]), key_fn=str, buffer_size=0)
    with pytest.raises(TypeError, match="expects key_fn to be a callable"):
        IterableWrapper([]).zip_with_iter(IterableWrapper([]), key_fn=None)


def test_zip_with_iter_length_and_repr():
    dp = IterableWrapper([1, 2]).zip_with_iter(IterableWrapper([2, 1]), key_fn=int)
    assert isinstance(dp, IterKeyZipper) and len(dp) == 2
    assert (
        repr(dp) == "IterKeyZipper(key_fn=int, ref_key_fn=int, keep_key=False, buffer_size=10000)"
    )


def test_outputs_keep_the_source_items_position():
    dp = IterableWrapper([2, 0, 1]).zip_with_map(SequenceWrapper(["x", "y", "z"]), key_fn=int)
    reset_pipeline(dp)
    assert [(dp.async_next(), current_position()) for _ in range(3)] == [
        ((2, "z"), 0),
        ((0, "x"), 1),
        ((1, "y"), 2),
    ]


def test_zip_with_map_looks_each_key_up():
    prices = SequenceWrapper({"a": 100, "b": 200, "c": 300, "d": 400})
    orders = IterableWrapper([("a", 1), ("b", 2), ("c", 3)])
    out = orders.zip_with_map(
        map_datapipe=prices, key_fn=first, merge_fn=lambda o, p: (o[0], o[1] + p)
    )
    assert list(out) == [("a", 101), ("b", 202), ("c", 303)]
    assert list(orders.zip_with_map(prices, first, keep_key=True))[0] == ("a", (("a", 1), 100))
    assert isinstance(out, MapKeyZipper) and len(out) == 3
    assert repr(out) == "MapKeyZipper(key_fn=first, keep_key=False)"


def test_zip_with_map_errors():
    with pytest.raises(KeyError, match="key_fn maps 'q' to 'q', which map_datapipe"):
        list(IterableWrapper(["q"]).zip_with_map(SequenceWrapper({"a": 1}), key_fn=str))
    with pytest.raises(TypeError, match=r"expects map_datapipe to be a MapDataPipe.*zip_with_iter"):
        IterableWrapper([]).zip_with_map(IterableWrapper([]), key_fn=str)
    with pytest.raises(ValueError, match="calls merge_fn with 2 positional arguments"):
        IterableWrapper([]).zip_with_map(SequenceWrapper([]), key_fn=str, merge_fn=lambda x: x)


def test_resume_from_every_step():
    check_resume_from_every_step(
        lambda: IterableWrapper([4, 1, 3, 0, 2]).zip_with_iter(
            IterableWrapper(range(5)), key_fn=int
        )
    )
    check_resume_from_every_step(
        lambda: IterableWrapper([4, 1, 3]).zip_with_map(SequenceWrapper("abcde"), key_fn=int)
    )


def test_same_output_everywhere():
    epochs = check_same_output_everywhere(
        lambda: (
            IterableWrapper(range(12))
            .shuffle()
            .sharding_filter()
            .zip_with_map(SequenceWrapper([i * i for i in range(12)]), key_fn=int)
            .zip_with_iter(
                IterableWrapper(range(12)),
                key_fn=first,
                ref_key_fn=int,
                merge_fn=lambda a, b: (*a, b),
            )
        )
    )
    assert sorted(epochs[0]) == [(i, i * i, i) for i in range(12)]
