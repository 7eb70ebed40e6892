"""Attacks on the caching blocks from the outside: resumes, stale fingerprints, damaged files.

Each test is the smallest case of a silent wrong-data bug that was found and fixed.
"""

from __future__ import annotations

import pytest

import pipeloom
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService

pytestmark = pytest.mark.timeout(60)


def identity(x):
    return x


# -- in_memory_cache: a worker whose part of a resumed epoch is empty ------------------------
def _cached(n):
    return IterableWrapper(range(n)).sharding_filter().map(identity).in_memory_cache()


def _resumed_epochs(n, service, *, step, warm_epochs, count=2):
    """The rest of the epoch resumed after ``step`` items, then ``count`` whole epochs."""
    with pipeloom.DataLoader(_cached(n), service(), seed=1) as loader:
        for _ in range(warm_epochs):
            list(loader)
        iterator = iter(loader)
        head = [next(iterator) for _ in range(step)]
        state = loader.state_dict()
    with pipeloom.DataLoader(_cached(n), service(), seed=1) as resumed:
        resumed.load_state_dict(state)
        return [head + list(resumed)] + [list(resumed) for _ in range(count)]


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_in_memory_cache_replays_every_item_after_a_resume_in_worker_threads(workers):
    # a worker resumed past the end of its shard cached nothing, took that for its whole
    # shard, and replayed nothing in every later epoch (5 workers, 4 items: some shards empty)
    n = 4
    for warm_epochs in (0, 1):
        for step in range(n + 1):
            got = _resumed_epochs(
                n, lambda: ThreadReadingService(workers), step=step, warm_epochs=warm_epochs
            )
            for index, epoch in enumerate(got):
                assert sorted(epoch) == list(range(n)), (warm_epochs, step, index, epoch)


def test_in_memory_cache_replays_every_item_after_a_resume_in_persistent_processes():
    def service():
        return MultiProcessingReadingService(3, persistent_workers=True, start_method="fork")

    got = _resumed_epochs(7, service, step=6, warm_epochs=0)
    assert [sorted(epoch) for epoch in got] == [list(range(7))] * 3
