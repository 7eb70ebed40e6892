"""The async block protocol and its synchronous adapters."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from pipeloom.datapipes import (
    BlockingReader,
    IterableWrapper,
    IterDataPipe,
    MapDataPipe,
    NotAvailable,
    SequenceWrapper,
    reset_pipeline,
)
from pipeloom.testing import collect, collect_async
from tests.datapipes.helpers import Flaky, OldStyleDouble
from tests.strategies import item_lists


class AsyncPlusOne(IterDataPipe):
    inputs = ("source",)

    def __init__(self, source):
        self.source = source

    def async_next(self):
        return self.source.async_next() + 1


def test_old_style_generator_block_works_synchronously_and_asynchronously():
    pipe = OldStyleDouble(IterableWrapper([1, 2, 3]))
    assert list(pipe) == [2, 4, 6]
    reset_pipeline(pipe)
    assert [pipe.async_next() for _ in range(3)] == [2, 4, 6]
    with pytest.raises(StopIteration):
        pipe.async_next()


def test_async_block_iterates_synchronously():
    assert list(AsyncPlusOne(IterableWrapper([1, 2]))) == [2, 3]


def test_exhausted_pipe_keeps_raising_stop_iteration_on_both_paths():
    pipe = AsyncPlusOne(OldStyleDouble(IterableWrapper([1])))
    iterator = iter(pipe)
    assert next(iterator) == 3
    for _ in range(3):
        with pytest.raises(StopIteration):
            next(iterator)
        with pytest.raises(StopIteration):
            pipe.async_next()


def test_each_top_level_iter_restarts_the_pipeline():
    pipe = AsyncPlusOne(IterableWrapper([1, 2, 3]))
    iterator = iter(pipe)
    next(iterator)
    assert list(pipe) == [2, 3, 4]


def test_an_older_iterator_is_invalidated_by_a_newer_iter():
    pipe = AsyncPlusOne(IterableWrapper([1, 2, 3]))
    first = iter(pipe)
    next(first)
    iter(pipe)
    with pytest.raises(RuntimeError, match="no longer valid.*fork"):
        next(first)


@settings(max_examples=30, deadline=None)
@given(items=item_lists)
def test_blocking_reader_waits_on_events_through_not_available(items):
    pipe = AsyncPlusOne(Flaky(items, seed=len(items)))
    assert collect_async(pipe) == [x + 1 for x in items]


@settings(max_examples=30, deadline=None)
@given(items=item_lists)
def test_mixed_old_style_and_async_blocks_equal_plain_python(items):
    pipe = AsyncPlusOne(OldStyleDouble(AsyncPlusOne(IterableWrapper(items))))
    expected = [(x + 1) * 2 + 1 for x in items]
    assert collect(pipe) == expected
    assert collect_async(pipe) == expected


def test_not_available_without_a_readiness_source_is_a_clear_error():
    class NeverReady(IterDataPipe):
        def async_next(self):
            raise NotAvailable

    with pytest.raises(RuntimeError, match="no block upstream of it offers a readiness source"):
        BlockingReader(NeverReady()).next()


def test_block_defining_neither_protocol_raises_type_error():
    class Empty(IterDataPipe):
        pass

    with pytest.raises(TypeError, match="neither async_next\\(\\) nor __iter__\\(\\)"):
        Empty().async_next()


def test_map_style_old_and_async_access_agree():
    class AsyncSquares(MapDataPipe):
        inputs = ("source",)

        def __init__(self, source):
            self.source = source

        def async_get(self, index):
            return self.source.async_get(index) ** 2

        def __len__(self):
            return len(self.source)

    pipe = AsyncSquares(SequenceWrapper([1, 2, 3]))
    assert pipe[2] == 9
    assert pipe.async_get(1) == 4
    assert list(pipe) == [1, 4, 9]
    assert len(pipe) == 3


def test_iter_pipe_without_length_says_so():
    with pytest.raises(TypeError, match="has no length"):
        len(AsyncPlusOne(IterableWrapper(iter([]))))


def test_inputs_must_be_a_tuple_of_names():
    with pytest.raises(TypeError, match="must be a tuple of attribute names"):

        class Bad(IterDataPipe):
            inputs = "source"  # type: ignore[assignment]


def test_parents_and_replace_parent_follow_declared_inputs():
    a, b, c = IterableWrapper([1]), IterableWrapper([2]), IterableWrapper([3])

    class Two(IterDataPipe):
        inputs = ("first", "rest")

        def __init__(self, first, *rest):
            self.first, self.rest = first, rest

        def __iter__(self):
            yield from ()

    pipe = Two(a, b)
    assert pipe.parents == (a, b)
    pipe.replace_parent(b, c)
    assert pipe.parents == (a, c)
    with pytest.raises(ValueError, match="has no input"):
        pipe.replace_parent(b, c)
