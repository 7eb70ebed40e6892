"""Tests of ``map`` (Mapper, MapMapper)."""

from __future__ import annotations

import collections
import pickle
import traceback

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeloom.datapipes import (
    IterableWrapper,
    IterDataPipe,
    MapDataPipe,
    MapMapper,
    Mapper,
    NotAvailable,
    SequenceWrapper,
    item_rng,
)
from pipeloom.events import Signal
from pipeloom.testing import (
    check_resume_from_every_step,
    check_same_output_everywhere,
    collect,
    collect_async,
)
from tests.datapipes.helpers import Stutter, drive
from tests.strategies import item_lists, small_ints


class OldStyleAddOne(IterDataPipe):
    """A block written the simple way: only a generator ``__iter__``."""

    inputs = ("source",)

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        for x in self.source:
            yield x + 1

    def state_dict(self):
        return {}


def double(x):
    return 2 * x


def test_map_applies_fn_to_each_item():
    assert list(IterableWrapper(range(4)).map(double)) == [0, 2, 4, 6]


def test_input_col_replaces_that_column_of_a_tuple():
    assert list(IterableWrapper([(1, 2, 3)]).map(double, input_col=1)) == [(1, 4, 3)]


def test_input_col_on_a_dict_replaces_the_key_and_leaves_the_input_alone():
    item = {"a": 1, "b": 2}
    assert list(IterableWrapper([item]).map(double, input_col="b")) == [{"a": 1, "b": 4}]
    assert item == {"a": 1, "b": 2}


def test_output_col_minus_one_appends_and_does_not_mutate_the_input_list():
    item = [1, 2]
    assert list(IterableWrapper([item]).map(double, input_col=0, output_col=-1)) == [[1, 2, 2]]
    assert item == [1, 2]


def test_output_col_writes_to_a_new_key():
    out = list(IterableWrapper([{"x": 3}]).map(double, input_col="x", output_col="y"))
    assert out == [{"x": 3, "y": 6}]


def test_several_input_cols_pass_positional_args_and_collapse_into_the_first():
    out = list(IterableWrapper([(1, 2, 3)]).map(lambda a, c: a + c, input_col=[0, 2]))
    assert out == [(4, 2)]


def test_several_input_cols_of_a_dict_collapse_into_the_first_key():
    out = list(
        IterableWrapper([{"a": 1, "b": 2, "c": 3}]).map(lambda a, b: a * b, input_col=("a", "b"))
    )
    assert out == [{"a": 2, "c": 3}]


def test_a_namedtuple_keeps_its_type():
    Point = collections.namedtuple("Point", "x y")
    (out,) = list(IterableWrapper([Point(1, 2)]).map(double, input_col=1))
    assert out == Point(1, 4) and type(out) is Point


def test_single_element_output_col_list_is_accepted_like_torchdata():
    assert list(IterableWrapper([[1, 0]]).map(double, input_col=0, output_col=[1])) == [[1, 2]]


def test_non_callable_fn_is_a_type_error():
    with pytest.raises(TypeError, match="expects fn to be a callable, got int"):
        IterableWrapper([1]).map(3)


def test_output_col_without_input_col_is_a_value_error():
    with pytest.raises(ValueError, match="output_col=1 but input_col=None"):
        IterableWrapper([1]).map(double, output_col=1)


def test_output_col_with_several_columns_is_a_value_error():
    with pytest.raises(ValueError, match="output_col must be a single index or key"):
        IterableWrapper([1]).map(double, input_col=0, output_col=[1, 2])


def test_fn_arity_is_checked_against_input_col():
    with pytest.raises(ValueError, match="with 2 positional arguments"):
        IterableWrapper([1]).map(double, input_col=[0, 1])


def test_unhashable_input_col_is_a_type_error():
    with pytest.raises(TypeError, match="input_col to be an index or a key"):
        IterableWrapper([1]).map(double, input_col={"a": 1})


def test_append_to_a_dict_is_a_clear_error():
    dp = IterableWrapper([{"a": 1}]).map(double, input_col="a", output_col=-1)
    with pytest.raises(TypeError, match="appends the result to a list or tuple item, got a dict"):
        list(dp)


def test_fn_error_keeps_type_and_traceback_and_notes_block_and_position():
    def boom(x):
        if x == 2:
            raise KeyError("bad")
        return x

    with pytest.raises(KeyError) as info:
        list(IterableWrapper(range(5)).map(boom))
    assert any(
        "Mapper(fn=test_fn_error_keeps" in n and "position 2" in n for n in info.value.__notes__
    )
    assert "boom" in "".join(traceback.format_tb(info.value.__traceback__))


def test_stop_iteration_from_fn_does_not_silently_end_the_stream():
    def stop(x):
        raise StopIteration

    with pytest.raises(RuntimeError, match="raised StopIteration"):
        list(IterableWrapper([1]).map(stop))


def test_len_and_repr():
    dp = IterableWrapper(range(7)).map(double, input_col=None)
    assert len(dp) == 7
    assert repr(dp) == "Mapper(fn=double)"
    assert (
        repr(dp.map(len, input_col=0, output_col=-1))
        == "Mapper(fn=len, input_col=0, output_col=-1)"
    )


def test_map_is_picklable_with_columns():
    dp = IterableWrapper([(1, 2)]).map(double, input_col=0, output_col=-1)
    assert list(pickle.loads(pickle.dumps(dp))) == [(1, 2, 2)]


def test_resume_from_every_step():
    check_resume_from_every_step(lambda: IterableWrapper(range(9)).map(double))
    check_resume_from_every_step(
        lambda: Stutter(IterableWrapper(range(9))).map(double, input_col=None)
    )


def test_not_available_upstream_loses_and_duplicates_nothing():
    items, stalls = drive(Stutter(IterableWrapper(range(50))).map(double))
    assert items == [2 * x for x in range(50)] and stalls > 0
    assert collect_async(Stutter(IterableWrapper(range(50))).map(double)) == items


pairs = st.lists(st.tuples(small_ints, small_ints, small_ints), max_size=30)
cols = st.sampled_from([0, 1, 2])


@given(pairs, cols, st.one_of(st.none(), st.just(-1), cols))
def test_columns_match_the_manual_transformation(items, input_col, output_col):
    def expected(item):
        value = double(item[input_col])
        new = list(item)
        if output_col is None:
            new[input_col] = value
        elif output_col == -1:
            new.append(value)
        else:
            new[output_col] = value
        return tuple(new)

    dp = IterableWrapper(items).map(double, input_col=input_col, output_col=output_col)
    assert collect(dp) == [expected(item) for item in items]


@given(item_lists, st.integers(0, 2**16))
def test_sync_and_async_iteration_agree(items, seed):
    def make():
        return Stutter(IterableWrapper(items), seed=seed).map(double)

    assert collect(make()) == collect_async(make()) == [2 * x for x in items]


@given(item_lists)
def test_old_style_generator_blocks_mix_with_async_blocks(items):
    dp = OldStyleAddOne(Stutter(IterableWrapper(items)).map(double)).map(double).batch(3)
    flat = [2 * (2 * x + 1) for x in items]
    assert collect(dp) == [flat[i : i + 3] for i in range(0, len(flat), 3)]
    assert collect_async(dp) == collect(dp)


class SlowMap(MapDataPipe):
    """Test map-style upstream: an index is NotAvailable the first time it is asked for."""

    inputs = ()

    def __init__(self, n):
        self.n, self.asked, self.signal = n, set(), Signal()

    def async_get(self, index):
        if index not in self.asked:
            self.asked.add(index)
            self.signal.fire()
            raise NotAvailable
        return index

    def __len__(self):
        return self.n

    def readiness_sources(self):
        return (self.signal,)


def test_map_mapper_applies_fn_on_access():
    dp = SequenceWrapper([(1, 2), (3, 4)]).map(double, input_col=0)
    assert len(dp) == 2 and dp[1] == (6, 4) and list(dp.to_iter()) == [(2, 2), (6, 4)]
    assert repr(dp) == "MapMapper(fn=double, input_col=0)"


def test_map_mapper_passes_not_available_through_and_waits():
    dp = MapMapper(SlowMap(3), double)
    with pytest.raises(NotAvailable):
        dp.async_get(1)
    assert dp.async_get(1) == 2
    assert dp[2] == 4


def test_map_mapper_notes_the_index_on_errors():
    dp = SequenceWrapper([1, 0]).map(lambda x: 1 / x)
    with pytest.raises(ZeroDivisionError) as info:
        dp[1]
    assert any("index 1" in note for note in info.value.__notes__)


def test_mapper_class_is_what_map_builds():
    assert type(IterableWrapper([1]).map(double)) is Mapper


def jitter(x):
    return x + item_rng().random()


@pytest.mark.timeout(120)
def test_same_items_and_item_rng_draws_under_every_service():
    ran = check_same_output_everywhere(
        lambda: IterableWrapper(range(12)).shuffle().sharding_filter().map(jitter).batch(3)
    )
    assert ran == ["in-process", "threads", "classic", "economic", "chunked"]


def test_map_style_map_without_fn_is_the_identity_as_in_torchdata():
    from pipeloom.datapipes import SequenceWrapper

    dp = SequenceWrapper([3, 4]).map()
    assert (dp[0], dp[1], len(dp)) == (3, 4, 2)
