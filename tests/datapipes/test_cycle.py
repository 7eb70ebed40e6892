"""Tests for Cycler."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import Cycler, IterableWrapper, reset_pipeline
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.helpers import Flaky, drain_retrying
from tests.strategies import item_lists


@settings(max_examples=50, deadline=None)
@given(items=item_lists, count=st.integers(0, 4))
def test_repeats_the_source_count_times(items, count):
    dp = IterableWrapper(items).cycle(count)
    assert list(dp) == items * count
    assert len(dp) == len(items) * count


def test_cycle_forever_keeps_repeating():
    dp = IterableWrapper([1, 2, 3]).cycle()
    reset_pipeline(dp)
    expected = list(itertools.islice(itertools.cycle([1, 2, 3]), 10))
    assert [dp.async_next() for _ in range(10)] == expected
    with pytest.raises(TypeError, match="repeats forever"):
        len(dp)


def test_cycle_forever_over_an_empty_source_stops():
    assert list(IterableWrapper([]).cycle()) == []
    assert list(IterableWrapper([]).cycle(3)) == []


def test_count_zero_yields_nothing_and_stop_repeats():
    dp = IterableWrapper([1]).cycle(0)
    reset_pipeline(dp)
    for _ in range(2):
        with pytest.raises(StopIteration):
            dp.async_next()


@pytest.mark.parametrize("count", [-1, 1.5, True])
def test_invalid_count_is_rejected(count):
    with pytest.raises(
        ValueError, match=r"count must be an int >= 0 or None, got .*; use None to repeat forever"
    ):
        IterableWrapper([1]).cycle(count)


def test_each_round_restarts_the_upstream_pipeline():
    dp = IterableWrapper(range(4)).sharding_filter().cycle(2)
    assert list(dp) == [0, 1, 2, 3, 0, 1, 2, 3]


def test_retrying_after_not_available_and_async_path():
    expected = list(range(5)) * 3
    assert drain_retrying(Flaky(range(5), seed=1).cycle(3)) == expected
    assert collect_async(Flaky(range(5), seed=1).cycle(3)) == expected


def test_resume_from_every_step_across_rounds():
    check_resume_from_every_step(lambda: IterableWrapper(range(3)).cycle(3))
    check_resume_from_every_step(lambda: IterableWrapper(range(6)).shuffle(buffer_size=3).cycle(2))


def test_repr_and_sync_path():
    assert repr(IterableWrapper([1]).cycle(2)) == "Cycler(count=2)"
    assert collect(Cycler(IterableWrapper("ab"), 2)) == list("abab")


def test_each_round_reshuffles_reproducibly():
    from pipeloom.datapipes import IterableWrapper
    from pipeloom.testing import collect

    def build():
        return IterableWrapper(range(8)).shuffle().cycle(3)

    items = collect(build(), seed=5)
    rounds = [items[0:8], items[8:16], items[16:24]]
    assert all(sorted(r) == list(range(8)) for r in rounds)
    assert rounds[0] != rounds[1] != rounds[2]
    assert collect(build(), seed=5) == items


def test_item_rng_differs_between_rounds():
    from pipeloom.datapipes import IterableWrapper, item_rng
    from pipeloom.testing import check_resume_from_every_step, collect

    def build():
        return IterableWrapper(range(4)).map(lambda x: int(item_rng().integers(10**6))).cycle(2)

    values = collect(build(), seed=1)
    assert values[:4] != values[4:]
    check_resume_from_every_step(build, seed=1)


def test_reading_the_same_epoch_again_starts_from_the_first_rounds_seeds():
    # reset() left the upstream blocks in the last round: the second read of the
    # epoch started with the last round's shuffle.
    from pipeloom.datapipes import IterableWrapper, seed_pipeline

    pipe = IterableWrapper(range(6)).shuffle().cycle(3)
    seed_pipeline(pipe, 0)
    first = list(pipe)
    assert first[:6] != first[12:]  # each round has its own order
    assert list(pipe) == first


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy", ["threads", "classic", "chunked"])
def test_a_cycle_after_the_workers_is_refused_with_advice(strategy):
    # Threads raised QueueBroken and processes hung until the timeout.
    from pipeloom import DataLoader
    from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService

    pipe = IterableWrapper(range(5)).sharding_filter().map(abs)
    if strategy == "chunked":
        pipe = pipe.batch(2)
    pipe = pipe.cycle(2)
    if strategy == "threads":
        service = ThreadReadingService(2)
    else:
        service = MultiProcessingReadingService(2, strategy=strategy, timeout=10)
    with pytest.raises(ValueError, match=r"restarts its input.*before the sharding point"):
        with DataLoader(pipe, service) as loader:  # planned at the first use
            list(loader)


def test_a_cycle_before_the_sharding_point_runs_under_workers():
    from pipeloom import DataLoader
    from pipeloom.reading_service import ThreadReadingService

    pipe = IterableWrapper(range(5)).cycle(2).sharding_filter()
    with DataLoader(pipe, ThreadReadingService(2)) as loader:
        assert list(loader) == [*range(5), *range(5)]
