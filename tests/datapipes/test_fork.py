"""Tests for fork()."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import (
    Forker,
    IterableWrapper,
    IterDataPipe,
    SequenceWrapper,
    current_position,
    reset_pipeline,
)
from pipeloom.datapipes._fork import _ForkHub, fork
from pipeloom.graph import upstream
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.helpers import Flaky, drain_retrying
from tests.strategies import item_lists


class CountingSource(IterDataPipe):
    """Counts how many epochs were started (resets) and items read."""

    def __init__(self, n):
        self.n = n
        self.resets = 0
        self.reads = 0
        self._i = 0

    def reset(self):
        self.resets += 1
        self._i = 0

    def async_next(self):
        if self._i >= self.n:
            raise StopIteration
        self._i += 1
        self.reads += 1
        return self._i - 1

    def state_dict(self):
        return {"i": self._i}

    def load_state_dict(self, state):
        self._i = state["i"]


@settings(max_examples=40, deadline=None)
@given(items=item_lists, n=st.integers(2, 4))
def test_every_child_sees_every_item(items, n):
    children = IterableWrapper(items).fork(n)
    assert len(children) == n
    assert list(children[0].zip(*children[1:])) == [(x,) * n for x in items]
    assert all(len(c) == len(items) for c in children)


def test_children_read_one_after_another_within_the_buffer():
    a, b = fork(IterableWrapper(range(5)), 2, buffer_size=5)
    assert list(a.concat(b)) == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]


def test_source_is_read_once_and_reset_once_per_epoch():
    source = CountingSource(6)
    a, b, c = source.fork(3)
    dp = a.zip(b, c)
    before = source.resets
    assert list(dp) == [(i, i, i) for i in range(6)]
    assert source.resets == before + 1
    assert source.reads == 6
    hubs = [blk for blk in upstream(dp) if isinstance(blk, _ForkHub)]
    assert len(hubs) == 1


def test_one_instance_returns_the_source_itself():
    source = IterableWrapper([1])
    assert source.fork(1) == [source]


def test_running_ahead_of_a_lagging_child_raises_buffer_error():
    a, b = IterableWrapper(range(10)).fork(2, buffer_size=3)
    reset_pipeline(a.zip(b))
    assert [a.async_next() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(
        BufferError,
        match=r"fork buffer of 3 items is full: child 1 is 3 items behind child 0 \(child 1 has "
        r"read no item yet: if the pipeline never reads it, make only as many children as it "
        r"reads\); consume the children more evenly, or raise buffer_size \(buffer_size=-1 "
        r"means unbounded\)",
    ):
        a.async_next()
    assert b.async_next() == 0
    assert a.async_next() == 3  # room again


def test_unbounded_buffer():
    a, b = IterableWrapper(range(3000)).fork(2, buffer_size=-1)
    assert list(a.concat(b)) == list(range(3000)) * 2


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_instances": 0}, ValueError, r"num_instances must be an int >= 1, got 0"),
        (
            {"num_instances": 2, "buffer_size": 0},
            ValueError,
            r"must be an int >= 1, got 0; use -1 for an unbounded",
        ),
        ({"num_instances": 2, "buffer_size": -2}, ValueError, r"got -2"),
    ],
)
def test_invalid_arguments_are_rejected(kwargs, error, match):
    with pytest.raises(error, match=match):
        fork(IterableWrapper([1]), **kwargs)


def test_map_source_is_rejected():
    with pytest.raises(TypeError, match=r"fork\(\) expects an IterDataPipe .* got SequenceWrapper"):
        fork(SequenceWrapper([1]), 2)


def test_retrying_after_not_available_and_async_path():
    def make():
        a, b = Flaky(range(12), seed=3).fork(2)
        return a.zip(b)

    expected = [(i, i) for i in range(12)]
    assert drain_retrying(make()) == expected
    assert collect_async(make()) == expected


def test_children_carry_the_item_stamp():
    class WithPosition(IterDataPipe):
        inputs = ("source",)

        def __init__(self, source):
            self.source = source

        def async_next(self):
            return self.source.async_next(), current_position()

    a, b = IterableWrapper("abc").fork(2)
    out = collect(WithPosition(a).concat(WithPosition(b)))
    assert out == [("a", 0), ("b", 1), ("c", 2)] * 2


def test_resume_from_every_step():
    def make():
        a, b = IterableWrapper(range(6)).fork(2)
        return a.concat(b)

    check_resume_from_every_step(make)

    def make_zip():
        a, b, c = Flaky(range(5)).fork(3)
        return a.zip(b).mux(c)

    check_resume_from_every_step(make_zip)


def test_repr():
    a, _ = IterableWrapper([1]).fork(2, buffer_size=7)
    assert isinstance(a, Forker)
    assert repr(a) == "Forker(index=0, num_instances=2, buffer_size=7)"
    assert repr(a.hub) == "_ForkHub(num_instances=2, buffer_size=7)"


def test_fork_copy_gives_each_child_its_own_item():
    rows = [{"v": [i]} for i in range(3)]
    a, b = fork(IterableWrapper(rows), 2, copy="deep")
    pairs = list(a.zip(b))
    assert all(x == y and x is not y and x["v"] is not y["v"] for x, y in pairs)
    a, b = fork(IterableWrapper(rows), 2, copy="shallow")
    x, y = next(iter(a.zip(b)))
    assert x is not y and x["v"] is y["v"]
    a, b = IterableWrapper(rows).fork(2)
    x, y = next(iter(a.zip(b)))
    assert x is y
    assert repr(IterableWrapper(rows).fork(2, copy="deep")[1]) == (
        "Forker(index=1, num_instances=2, buffer_size=1000, copy='deep')"
    )
    with pytest.raises(ValueError, match="copy must be None, 'shallow' or 'deep', got 'full'"):
        IterableWrapper(rows).fork(2, copy="full")
