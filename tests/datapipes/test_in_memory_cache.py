"""in_memory_cache: fill once, replay from memory, bounded by size, right under resume/workers."""

from __future__ import annotations

import threading

import pytest
import torch

import pipeloom
from pipeloom.datapipes import InMemoryCacheHolder, IterableWrapper
from pipeloom.datapipes._in_memory_cache import item_nbytes
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)
from pipeloom.testing import check_resume_from_every_step, collect


class Counter:
    """Counts calls (thread-safe, shared by worker threads); a pickled copy starts at 0."""

    def __init__(self):
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, x):
        with self.lock:
            self.calls += 1
        return x * x

    def __deepcopy__(self, memo):  # worker threads share it
        return self

    def __getstate__(self):
        return {"calls": 0}

    def __setstate__(self, state):
        self.calls = 0
        self.lock = threading.Lock()


def identity(x):
    return x


def jitter(x):
    return x + float(pipeloom.item_rng().random())


def made(n=20, fn=None):
    """Source -> sharding point -> filter -> per-item work."""
    return (
        IterableWrapper(range(n)).sharding_filter().filter(lambda x: x % 4 != 1).map(fn or identity)
    )


def cached(n=20, fn=None, **kwargs):
    return made(n, fn).in_memory_cache(**kwargs).map(jitter)


def uncached(n=20):
    """The same graph with a pass-through where the cache is (seeds follow graph places)."""
    return made(n).map(identity).map(jitter)


def epochs(pipe, service=None, count=3, seed=1):
    with pipeloom.DataLoader(pipe, service, seed=seed) as loader:
        return [list(loader) for _ in range(count)]


SERVICES = [
    None,
    ThreadReadingService(2),
    MultiProcessingReadingService(2),
    MultiProcessingReadingService(2, persistent_workers=True),
]
SERVICE_IDS = ["in-process", "threads", "processes", "persistent-processes"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("service", SERVICES, ids=SERVICE_IDS)
def test_every_epoch_equals_the_uncached_pipeline(service):
    assert epochs(cached(), service) == epochs(uncached())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["in-process", "processes"])
def test_a_rank_caches_its_share(kind):
    def service():
        inner = (
            InProcessReadingService() if kind == "in-process" else MultiProcessingReadingService(2)
        )
        inner.set_outer_sharding(3, 1)
        return inner

    assert epochs(cached(), service()) == epochs(uncached(), service())


def test_in_process_later_epochs_do_no_upstream_work():
    counter = Counter()
    pipe = made(fn=counter).in_memory_cache()
    first = collect(pipe)
    calls = counter.calls
    assert collect(pipe, epoch=1) == first and collect(pipe, epoch=2) == first
    assert counter.calls == calls == 15


@pytest.mark.timeout(60)
def test_each_worker_thread_caches_its_shard_and_makes_one_item_live():
    counter = Counter()
    with pipeloom.DataLoader(
        made(fn=counter).in_memory_cache(), ThreadReadingService(2), seed=0
    ) as loader:
        first = list(loader)
        assert counter.calls == 15
        assert list(loader) == first
        assert counter.calls == 15 + 2  # the first item of each worker's stream, to find its place


def big(x):
    return bytes(300_000) + bytes([x])


def test_a_size_bound_keeps_the_last_items_and_reads_the_first_live():
    counter = Counter()
    pipe = IterableWrapper(range(10)).map(counter).map(big).in_memory_cache(size=1)
    first = collect(pipe)
    assert [x[-1] for x in first] == [x * x for x in range(10)]
    cache = pipe
    assert cache.cached_bytes <= 1 << 20 and cache.cached_items == 3
    counter.calls = 0
    assert collect(pipe, epoch=1) == first
    assert counter.calls == 7  # only the items that did not fit


def test_an_item_larger_than_the_bound_is_never_kept():
    pipe = IterableWrapper(range(3)).map(lambda x: bytes(2 << 20)).in_memory_cache(size=1)
    assert len(collect(pipe)) == 3 and pipe.cached_items == 0
    assert len(collect(pipe, epoch=1)) == 3


def test_an_interrupted_first_epoch_fills_again():
    counter = Counter()
    pipe = IterableWrapper(range(6)).map(counter).in_memory_cache()
    iterator = iter(pipe)
    next(iterator), next(iterator)
    assert collect(pipe) == [x * x for x in range(6)]
    counter.calls = 0
    assert collect(pipe) == [x * x for x in range(6)] and counter.calls == 0


def test_resume_from_every_step_of_the_first_epoch():
    check_resume_from_every_step(lambda: cached(), seed=4)


def test_resume_from_every_step_of_a_later_epoch():
    check_resume_from_every_step(lambda: cached(), seed=4, epoch=3)


def test_a_cold_resume_caches_from_there_and_later_epochs_are_whole():
    with pipeloom.DataLoader(cached(), seed=2) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(6)]
        state = loader.state_dict()
    reference = epochs(uncached(), seed=2)
    with pipeloom.DataLoader(cached(), seed=2) as resumed:
        resumed.load_state_dict(state)
        assert head + list(resumed) == reference[0]
        assert list(resumed) == reference[1]  # the first 6 items live, the rest from memory
        assert list(resumed) == reference[2]


def test_a_warm_cache_resumed_mid_epoch_stays_for_later_epochs():
    counter = Counter()
    pipe = IterableWrapper(range(8)).map(counter).in_memory_cache().map(jitter)
    with pipeloom.DataLoader(pipe, seed=0) as loader:
        whole = [list(loader) for _ in range(3)]
        loader.set_epoch(1)
        iterator = iter(loader)
        head = [next(iterator) for _ in range(3)]
        state = loader.state_dict()
        loader.load_state_dict(state)
        assert head + list(loader) == whole[1]
        counter.calls = 0
        assert list(loader) == whole[2] and counter.calls == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["economic", "chunked"])
def test_item_workers_pass_items_through(strategy):
    def pipe(cache):
        items = IterableWrapper(range(16)).sharding_filter().map(identity)
        items = items.in_memory_cache() if cache else items.map(identity)
        return items.map(jitter).batch(4)

    service = MultiProcessingReadingService(2, strategy=strategy, persistent_workers=True)
    assert epochs(pipe(True), service) == epochs(pipe(False))


def test_random_upstream_is_refused_unless_allowed():
    with pytest.raises(ValueError, match=r"replay the randomness of Shuffler.*allow_random=True"):
        IterableWrapper(range(4)).shuffle().in_memory_cache()
    with pytest.raises(ValueError, match=r"randomness of Cycler.*seeds item_rng\(\) draws"):
        IterableWrapper(range(4)).cycle(2).in_memory_cache()
    frozen = IterableWrapper(range(4)).shuffle().in_memory_cache(allow_random=True)
    assert collect(frozen, epoch=1) == collect(frozen, epoch=0)


def test_item_rng_upstream_is_refused_at_the_first_item():
    with pytest.raises(RuntimeError, match=r"drew from item_rng\(\) upstream"):
        collect(IterableWrapper(range(4)).map(jitter).in_memory_cache())


@pytest.mark.parametrize("size", [0, -1, "1", True])
def test_bad_size_says_what_is_expected(size):
    with pytest.raises(ValueError, match=r"size must be a number of MiB > 0, or None for no limit"):
        InMemoryCacheHolder(IterableWrapper([1]), size)


@pytest.mark.parametrize("flag", ["no", 1, None])
def test_allow_random_must_be_a_bool(flag):
    # "no" was taken for True: a shuffle upstream was then frozen without a word
    with pytest.raises(
        TypeError, match=r"allow_random must be a bool, got str 'no'|got int 1|got NoneType"
    ):
        InMemoryCacheHolder(IterableWrapper([1]).shuffle(), allow_random=flag)


def test_length_and_repr():
    pipe = IterableWrapper(range(5)).in_memory_cache(size=2)
    assert len(pipe) == 5
    assert repr(pipe) == "InMemoryCacheHolder(size=2 MiB, cached_items=0)"


def test_item_sizes_count_the_data_of_tensors_arrays_and_bytes():
    assert item_nbytes(torch.zeros(1000, dtype=torch.float64)) >= 8000
    assert item_nbytes({"a": [bytes(500), "x" * 500]}) >= 1000


def twice(x):
    return [x, x]


@pytest.mark.timeout(60)
def test_an_empty_rest_resumed_after_the_merge_does_not_count_as_a_whole_epoch():
    """Worker processes built the batches (one to many before .batch()), threads resume:
    the state, translated, says nothing of the cache's items, and the rest of the epoch
    was empty; the cache took that for a whole epoch of no items and every later epoch
    was empty (resume fuzzer, seed 752408). Now it fills again in the next epoch."""

    def build():
        pipe = IterableWrapper(range(2)).sharding_filter().flatmap(twice).batch(4)
        return pipe.in_memory_cache()

    with pipeloom.DataLoader(build(), MultiProcessingReadingService(1, timeout=30)) as stopped:
        epoch = iter(stopped)
        assert next(epoch) == [0, 0, 1, 1]  # the whole epoch
        state = stopped.state_dict()
    with pipeloom.DataLoader(build(), ThreadReadingService(1)) as resumed:
        resumed.load_state_dict(state)
        assert list(resumed) == []
        assert list(resumed) == [[0, 0, 1, 1]]
        assert list(resumed) == [[0, 0, 1, 1]]
