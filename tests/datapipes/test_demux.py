"""Tests for demux()."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import Demultiplexer, IterableWrapper, SequenceWrapper, reset_pipeline
from pipeloom.datapipes._demux import demux
from pipeloom.testing import check_resume_from_every_step, collect_async
from tests.datapipes.helpers import Flaky, drain_retrying
from tests.strategies import item_lists


def mod3(x):
    return x % 3


@settings(max_examples=40, deadline=None)
@given(items=item_lists, n=st.integers(1, 4))
def test_each_child_gets_exactly_its_items_in_order(items, n):
    children = IterableWrapper(items).demux(n, lambda x: x % n, buffer_size=-1)
    got = [list(c) for c in children]
    assert got == [[x for x in items if x % n == i] for i in range(n)]


def test_none_is_dropped_with_drop_none():
    source = IterableWrapper(range(10))
    a, b = source.demux(2, lambda x: None if x % 3 == 0 else x % 2, drop_none=True)
    assert list(a) == [2, 4, 8]
    assert list(b) == [1, 5, 7]


def test_none_without_drop_none_is_an_error():
    (a,) = IterableWrapper([1]).demux(1, lambda x: None)
    match = r"classifier_fn returned None for item 1; .* drop_none=True"
    with pytest.raises(ValueError, match=match):
        list(a)


@pytest.mark.parametrize("value", [2, -1, "0", True])
def test_out_of_range_classification_names_the_value_and_range(value):
    a, _ = IterableWrapper([5]).demux(2, lambda x: value)
    match = rf"classifier_fn returned {value!r} for item 5; expected an int in \[0, 2\)"
    with pytest.raises(ValueError, match=match):
        list(a)


def test_buffer_overflow_raises_buffer_error():
    even, odd = IterableWrapper(range(20)).demux(2, lambda x: x % 2, buffer_size=3)
    reset_pipeline(even.zip(odd))
    assert [even.async_next() for _ in range(4)] == [0, 2, 4, 6]
    match = r"demux buffer of 3 items is full: child 1 is 4 items behind child 0"
    with pytest.raises(BufferError, match=match):
        even.async_next()
    assert odd.async_next() == 1
    assert even.async_next() == 8  # the item read when the buffer overflowed was kept
    assert [odd.async_next() for _ in range(4)] == [3, 5, 7, 9]


def test_interleaved_children_need_little_buffer():
    a, b, c = IterableWrapper(range(30)).demux(3, mod3, buffer_size=2)
    assert list(a.zip(b, c)) == [(i, i + 1, i + 2) for i in range(0, 30, 3)]


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((0, mod3), ValueError, r"num_instances must be an int >= 1, got 0"),
        ((2, 3), TypeError, r"classifier_fn must be callable .* got int"),
        (
            (2, mod3, False, 0),
            ValueError,
            r"buffer_size must be an int >= 1, got 0; use -1 for an unbounded buffer",
        ),
        ((2, mod3, "yes"), TypeError, r"drop_none must be a bool, got str"),
    ],
)
def test_invalid_arguments_are_rejected(args, error, match):
    with pytest.raises(error, match=match):
        demux(IterableWrapper([1]), *args)
    with pytest.raises(TypeError, match=r"demux\(\) expects an IterDataPipe"):
        demux(SequenceWrapper([1]), 2, mod3)


def test_retrying_after_not_available_and_async_path():
    def make():
        a, b, c = Flaky(range(15), seed=4).demux(3, mod3)
        return a.concat(c, b)

    expected = list(range(0, 15, 3)) + list(range(2, 15, 3)) + list(range(1, 15, 3))
    assert drain_retrying(make()) == expected
    assert collect_async(make()) == expected


def test_resume_from_every_step():
    def make():
        a, b, c = IterableWrapper(range(10)).demux(3, mod3)
        return b.concat(a).mux(c)

    check_resume_from_every_step(make)

    def make_flaky():
        a, b = Flaky(range(9)).demux(2, lambda x: x % 2)
        return a.concat(b)

    check_resume_from_every_step(make_flaky)


def test_repr():
    a, _ = IterableWrapper([1]).demux(2, mod3, buffer_size=5)
    assert isinstance(a, Demultiplexer)
    assert repr(a) == (
        "Demultiplexer(index=0, num_instances=2, classifier_fn=mod3, drop_none=False, "
        "buffer_size=5)"
    )
