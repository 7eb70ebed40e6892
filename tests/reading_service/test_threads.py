"""ThreadReadingService: same items, same order as in-process, at any thread count."""

from __future__ import annotations

import threading

import pytest
import torch.utils.data
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeloom
from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.errors import NotAvailable
from pipeloom.reading_service import InProcessReadingService, ThreadReadingService
from tests.reading_service import pipelines


@settings(max_examples=12, deadline=None)
@given(threads=st.integers(0, 4), seed=st.integers(0, 2**16), n=st.integers(0, 40))
def test_output_equals_in_process_at_any_thread_count(threads, seed, n):
    expected = list(DataLoader(pipelines.augmented(n), InProcessReadingService(), seed=seed))
    with DataLoader(pipelines.augmented(n), ThreadReadingService(threads), seed=seed) as loader:
        assert list(loader) == expected


def test_batches_built_in_threads_equal_in_process_batches():
    def pipe():
        return IterableWrapper(range(23)).sharding_filter().map(lambda x: x * 2).batch(5).collate()

    expected = [b.tolist() for b in DataLoader(pipe(), seed=0)]
    with DataLoader(pipe(), ThreadReadingService(3), seed=0) as loader:
        assert [b.tolist() for b in loader] == expected


def test_epochs_differ_and_replay():
    with DataLoader(pipelines.augmented(), ThreadReadingService(2), seed=1) as loader:
        first, second = list(loader), list(loader)
        loader.set_epoch(0)
        assert first != second and list(loader) == first


def test_arrival_order_mode_yields_the_same_items():
    expected = sorted(x for batch in DataLoader(pipelines.augmented(), seed=2) for x in batch)
    with DataLoader(
        pipelines.augmented(), ThreadReadingService(3, in_order=False), seed=2
    ) as loader:
        assert sorted(x for batch in loader for x in batch) == expected


def test_worker_exception_reraises_with_type_worker_block_and_item():
    def explode(x):
        if x == 7:
            raise KeyError("bad sample")
        return x

    pipe = IterableWrapper(range(10)).sharding_filter().map(explode)
    with DataLoader(pipe, ThreadReadingService(2), seed=0) as loader:
        with pytest.raises(KeyError, match="bad sample") as info:
            list(loader)
    message = str(info.value)
    assert "worker thread 1" in message and "Mapper(fn=" in message and "position 7" in message
    assert "Traceback" in message and isinstance(info.value.__cause__, pipeloom.WorkerError)


def test_get_worker_info_inside_threads():
    def who(_):
        info = pipeloom.get_worker_info()
        return (info.id, info.num_workers)

    pipe = IterableWrapper(range(6)).sharding_filter().map(who)
    with DataLoader(pipe, ThreadReadingService(3), seed=0) as loader:
        assert list(loader) == [(i % 3, 3) for i in range(6)]
    assert pipeloom.get_worker_info() is None


def test_breaking_out_and_shutdown_stop_every_thread():
    before = set(threading.enumerate())
    loader = DataLoader(
        IterableWrapper(range(1000)).sharding_filter(), ThreadReadingService(3), seed=0
    )
    for i, _ in enumerate(loader):
        if i == 5:
            break
    list(loader)  # a new epoch replaces the abandoned one
    loader.shutdown()
    assert set(threading.enumerate()) <= before


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_thread_counts_are_explained(bad):
    with pytest.raises(ValueError, match="num_threads must be an int >= 0"):
        ThreadReadingService(bad)


def test_in_order_must_be_a_bool():
    with pytest.raises(TypeError, match="in_order must be a bool, got str 'yes'; pass True or"):
        ThreadReadingService(2, in_order="yes")


def test_item_rng_draws_continue_across_the_merge():
    from tests.reading_service.pipelines import draws_on_both_sides_of_the_merge as build

    expected = list(DataLoader(build(), seed=4))
    for threads in (1, 3):
        with DataLoader(build(), ThreadReadingService(threads), seed=4) as loader:
            assert list(loader) == expected


def test_a_ready_output_is_not_held_back_by_a_slow_neighbour():
    release = threading.Event()

    def slow_at_two(x):
        if x == 2:
            release.wait(20)
        return x

    pipe = IterableWrapper(range(6)).sharding_filter().map(slow_at_two).filter(lambda x: x != 4)
    with DataLoader(pipe, ThreadReadingService(2), seed=0) as loader:
        iterator = iter(loader)
        assert next(iterator) == 0
        waiter = threading.Timer(10, release.set)  # only if item 1 were held back
        waiter.start()
        assert next(iterator) == 1  # ready long before item 2: must not wait for it
        assert not release.is_set(), "item 1 came only after item 2 was released"
        release.set()
        assert list(iterator) == [2, 3, 5]
        waiter.cancel()


class _Rows(torch.utils.data.Dataset):
    """A map-style dataset that records which object served each item."""

    def __init__(self, n: int) -> None:
        self.rows = [[i, i + 1] for i in range(n)]
        self.served_by: set[int] = set()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> list[int]:
        self.served_by.add(id(self))
        return self.rows[index]


class _NotADataset:
    def __init__(self) -> None:
        self.served_by: set[int] = set()

    def double(self, x: int) -> int:
        self.served_by.add(id(self))
        return 2 * x


def test_threads_share_the_torch_dataset_behind_map_getitem():
    dataset = _Rows(30)
    pipe = IterableWrapper(range(30)).sharding_filter().map(dataset.__getitem__).batch(4)
    expected = list(DataLoader(pipe, seed=0))
    dataset.served_by.clear()
    with DataLoader(pipe, ThreadReadingService(3), seed=0) as loader:
        assert list(loader) == expected
    # Every thread read the user's dataset itself: nothing deep-copied its rows.
    assert dataset.served_by == {id(dataset)}


def test_other_bound_methods_are_still_copied_per_thread():
    owner = _NotADataset()
    pipe = IterableWrapper(range(12)).sharding_filter().map(owner.double)
    with DataLoader(pipe, ThreadReadingService(2), seed=0) as loader:
        assert list(loader) == [2 * x for x in range(12)]
    assert owner.served_by == set()  # each thread called its own copy


def test_threads_start_before_any_produces(monkeypatch):
    from pipeloom.reading_service.workers import thread as worker_thread

    started: list[int] = []
    produced_while_starting: list[int] = []
    real = worker_thread.produce_epoch

    def recording(*args, **kwargs):
        produced_while_starting.append(len(started))
        return real(*args, **kwargs)

    real_start = worker_thread.WorkerThread.start

    def counting_start(self):
        real_start(self)
        started.append(1)

    monkeypatch.setattr(worker_thread, "produce_epoch", recording)
    monkeypatch.setattr(worker_thread.WorkerThread, "start", counting_start)
    pipe = IterableWrapper(range(40)).sharding_filter().map(lambda x: x + 1)
    with DataLoader(pipe, ThreadReadingService(4), seed=0) as loader:
        assert list(loader) == list(range(1, 41))
    # Each thread began its epoch only once all four were started (the gate).
    assert produced_while_starting == [4, 4, 4, 4]


def test_a_worker_thread_wakes_the_merge_only_when_it_waits_for_that_worker():
    from pipeloom.events import Waiter
    from pipeloom.reading_service.workers.thread import WorkerThread

    worker = WorkerThread(
        IterableWrapper([]), index=0, count=1, seed=0, capacity=8, epoch=0, resume=None
    )  # not started: this thread puts, as the worker would
    waiter = Waiter()
    worker.readiness()[0].attach(waiter)
    worker.queue.put("ahead")  # the merge waits for another worker: not woken
    assert waiter.generation == 0
    assert worker.get_nowait() == "ahead"
    worker.queue.put("next")  # the merge got what it asked for: still not woken
    assert waiter.generation == 0
    assert worker.get_nowait() == "next"
    with pytest.raises(NotAvailable):
        worker.get_nowait()  # the merge now waits for this worker
    worker.queue.put("wanted")
    assert waiter.generation == 1
    assert worker.get_nowait() == "wanted"
    worker.close()
