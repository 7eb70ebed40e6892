"""Tests for Prefetcher."""

from __future__ import annotations

import gc
import pickle
import threading
import time
import traceback

import pytest

from pipeloom.datapipes import (
    BlockingReader,
    IterableWrapper,
    IterDataPipe,
    Prefetcher,
    reset_pipeline,
)
from pipeloom.datapipes.runtime import waited_sources
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.helpers import Flaky, WithPosition, raise_in_source


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name.startswith("pipeloom Prefetcher")]


class SlowSource(IterDataPipe):
    """Old-style source: sleeps ``delay`` s per item (test data, not polling)."""

    def __init__(self, n, delay=0.0, fail_at=None):
        self.n, self.delay, self.fail_at = n, delay, fail_at
        self.produced = 0
        self.reached = {}

    def __iter__(self):
        for i in range(self.n):
            if i == self.fail_at:
                raise_in_source(i)
            if self.delay:
                time.sleep(self.delay)
            self.produced += 1
            event = self.reached.get(self.produced)
            if event is not None:
                event.set()
            yield i


def test_yields_every_item_in_order_sync_and_async():
    dp = IterableWrapper(range(50)).prefetch(4)
    assert list(dp) == list(range(50))
    assert collect_async(dp) == list(range(50))
    assert len(dp) == 50


def test_waiting_consumer_sleeps_until_an_item_arrives(monkeypatch):
    # A consumer that polled would ask the prefetcher thousands of times while the
    # source sleeps; one that waits asks a few times per item, however loaded the
    # machine (counting calls, not CPU time or the wall clock).
    calls = [0]
    async_next = Prefetcher.async_next

    def counted(self):
        calls[0] += 1
        return async_next(self)

    monkeypatch.setattr(Prefetcher, "async_next", counted)
    dp = SlowSource(20, delay=0.05).prefetch(2)
    assert list(dp) == list(range(20))
    assert calls[0] <= 10 * 21, calls[0]


def test_runs_ahead_of_the_consumer():
    source = SlowSource(20)
    fifth = source.reached[5] = threading.Event()
    dp = source.prefetch(buffer_size=5)
    reset_pipeline(dp)
    reader = BlockingReader(dp)
    assert reader.next(timeout=10) == 0
    assert fifth.wait(timeout=10)
    assert source.produced >= 5  # before the consumer asked for the 2nd item
    assert [reader.next(timeout=10) for _ in range(19)] == list(range(1, 20))
    reader.close()


def test_source_exception_is_raised_in_the_consumer_with_its_traceback():
    dp = SlowSource(10, fail_at=3).prefetch(2)
    it = iter(dp)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="bad item 3") as info:
        next(it)
    text = "".join(traceback.format_exception(info.value))
    assert "raise_in_source" in text
    assert "prefetch thread" in text
    with pytest.raises(StopIteration):
        next(it)


def test_reset_mid_stream_stops_and_joins_the_thread():
    dp = SlowSource(1000).prefetch(3)
    it = iter(dp)
    next(it)
    assert len(prefetch_threads()) == 1
    reset_pipeline(dp)
    assert prefetch_threads() == []
    assert list(dp)[:3] == [0, 1, 2]


def test_garbage_collection_stops_the_thread():
    dp = SlowSource(1000).prefetch(3)
    it = iter(dp)
    next(it)
    assert len(prefetch_threads()) == 1
    del dp, it
    gc.collect()
    assert prefetch_threads() == []


def test_no_thread_leak_over_many_epochs():
    before = threading.active_count()
    dp = IterableWrapper(range(20)).prefetch(3)
    for epoch in range(50):
        it = iter(dp)
        assert [next(it) for _ in range(epoch % 7)] == list(range(epoch % 7))
    reset_pipeline(dp)
    assert prefetch_threads() == []
    assert threading.active_count() <= before


def test_waits_on_an_upstream_that_is_not_ready_through_its_events():
    assert collect_async(Flaky(range(40), seed=2).prefetch(3)) == list(range(40))
    assert collect(Flaky(range(40), seed=3).map(lambda x: x + 1).prefetch(1)) == list(range(1, 41))


def test_a_consumer_behind_a_prefetch_waits_on_its_signal_only():
    # It also watched the upstream's sources (worker queues), which only the prefetch thread
    # reads: each item woke it for nothing (twice the sleeps behind pin_memory()), and two
    # threads bound one ProcessQueue at once (a batch lost, fixed in the queue).
    upstream = Flaky(range(4), seed=1)
    prefetched = upstream.prefetch(2)
    assert waited_sources(prefetched) == list(prefetched.readiness_sources())
    assert waited_sources(upstream.map(str)) == list(upstream.readiness_sources())
    # an upstream block also read another way is still watched
    both = prefetched.zip(upstream)
    assert set(map(id, waited_sources(both))) == {
        id(s) for s in [*prefetched.readiness_sources(), *upstream.readiness_sources()]
    }


def test_items_keep_their_stamps():
    pairs = collect(WithPosition(IterableWrapper("abcde").prefetch(2)))
    assert pairs == [(c, i) for i, c in enumerate("abcde")]


def test_resume_from_every_step():
    check_resume_from_every_step(lambda: IterableWrapper(range(12)).prefetch(3))
    check_resume_from_every_step(lambda: Flaky(range(8)).prefetch(2).shuffle(buffer_size=3))
    assert prefetch_threads() == [] or all(not t.is_alive() for t in prefetch_threads())


def test_state_dict_pauses_the_thread_and_saves_the_buffer():
    source = SlowSource(10)
    third = source.reached[4] = threading.Event()
    dp = source.prefetch(3)
    reset_pipeline(dp)
    reader = BlockingReader(dp)
    assert reader.next(timeout=10) == 0
    assert third.wait(timeout=10)
    state = dp.state_dict()
    assert dp._worker.parked and len(prefetch_threads()) == 1  # parked, not stopped
    assert state["items"] and [item for item, _ in state["items"]] == [1, 2, 3]
    assert [reader.next(timeout=10) for _ in range(9)] == list(range(1, 10))
    reader.close()


def test_a_pickled_copy_is_fresh():
    dp = IterableWrapper(range(5)).prefetch(2)
    it = iter(dp)
    next(it)
    copy = pickle.loads(pickle.dumps(dp))
    assert copy._worker is None
    assert list(copy) == list(range(5))
    reset_pipeline(dp)


def test_invalid_buffer_size_and_repr():
    match = r"buffer_size must be an int >= 1, got 0; use buffer_size=1"
    with pytest.raises(ValueError, match=match):
        IterableWrapper([1]).prefetch(0)
    assert repr(IterableWrapper([1]).prefetch(7)) == "Prefetcher(buffer_size=7)"
    assert isinstance(IterableWrapper([1]).prefetch(), Prefetcher)
