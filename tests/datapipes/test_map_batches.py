"""BatchMapper (map_batches): a function over runs of items, results one by one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import (
    BatchMapper,
    IterableWrapper,
    current_key,
    current_position,
    item_rng,
    reset_pipeline,
)
from pipeloom.testing import check_resume_from_every_step, collect_async
from tests.datapipes.everywhere import check_same_output_everywhere
from tests.datapipes.helpers import Flaky


def plus_one(batch):
    return [x + 1 for x in batch]


def test_calls_fn_per_run_and_flattens():
    calls = []

    def record(batch):
        calls.append(list(batch))
        return plus_one(batch)

    assert list(IterableWrapper(range(5)).map_batches(record, batch_size=3)) == [1, 2, 3, 4, 5]
    assert calls == [[0, 1, 2], [3, 4]]


def test_results_may_be_more_or_fewer_than_items():
    def pairs(batch):
        return [sum(batch)] if len(batch) == 2 else batch * 2

    assert list(IterableWrapper(range(5)).map_batches(pairs, 2)) == [1, 5, 4, 4]


def test_input_columns():
    rows = IterableWrapper([(1, "a", 10), (2, "b", 20)])
    assert list(rows.map_batches(lambda b: b, 2, input_col=1)) == ["a", "b"]
    assert list(rows.map_batches(lambda b: [x * y for x, y in b], 2, input_col=[0, 2])) == [10, 40]


@settings(max_examples=40, deadline=None)
@given(items=st.lists(st.integers(), max_size=30), size=st.integers(1, 7))
def test_identity_gives_the_items_back(items, size):
    assert list(IterableWrapper(items).map_batches(list, size)) == items


def test_results_carry_the_first_items_position():
    dp = IterableWrapper(range(4)).map_batches(lambda b: [sum(b)] * 3, 2)
    reset_pipeline(dp)
    assert [(dp.async_next(), current_position()) for _ in range(6)] == [
        (1, 0),
        (1, 0),
        (1, 0),
        (5, 2),
        (5, 2),
        (5, 2),
    ]


def test_each_result_is_keyed_as_an_output_of_the_runs_first_item():
    dp = IterableWrapper(range(4)).map_batches(lambda b: [sum(b)] * 3, 2)
    reset_pipeline(dp)
    keys = [(dp.async_next(), current_key())[1] for _ in range(6)]
    assert keys == [(0, 0), (0, 1), (0, 2), (2, 0), (2, 1), (2, 2)]


def draw(x):
    return (x, int(item_rng().integers(1 << 40)))


def test_item_rng_after_it_draws_differently_for_each_result():
    # every result of a run used to carry the run's first stamp: the same numbers for all
    pipe = IterableWrapper(range(12)).map_batches(lambda b: b * 2, 4).map(draw)
    values = [value for _, value in pipe]
    assert len(values) == 24 and len(set(values)) == 24


def test_resume_mid_run_draws_as_the_uninterrupted_epoch():
    check_resume_from_every_step(
        lambda: IterableWrapper(range(7)).map_batches(lambda b: b * 2, 3).map(draw)
    )


def test_survives_not_available():
    assert collect_async(BatchMapper(Flaky(range(11), seed=4), plus_one, 4)) == list(range(1, 12))


def test_errors():
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        IterableWrapper([]).map_batches(plus_one, 0)
    with pytest.raises(TypeError, match="expects fn to be a callable"):
        IterableWrapper([]).map_batches(None, 2)
    with pytest.raises(TypeError, match="must return an iterable of results, got int"):
        list(IterableWrapper([1]).map_batches(len, 2))


def test_repr():
    dp = IterableWrapper([]).map_batches(plus_one, 3, input_col=0)
    assert repr(dp) == "BatchMapper(fn=plus_one, batch_size=3, input_col=0)"


def test_resume_from_every_step():
    check_resume_from_every_step(lambda: IterableWrapper(range(7)).map_batches(lambda b: b * 2, 3))


def test_same_output_everywhere():
    epochs = check_same_output_everywhere(
        lambda: IterableWrapper(range(10)).shuffle().sharding_filter().map_batches(plus_one, 4)
    )
    assert sorted(epochs[0]) == list(range(1, 11))
