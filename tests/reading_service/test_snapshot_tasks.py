"""A snapshot after ``batch`` under workers.

Under ``economic`` and ``chunked`` each task (also one the main process runs) reads its
own records by position, and never writes.

The main process, where it ran a batch task itself, took the snapshot for a whole epoch in
one process: it replayed the records from the first, so a checkpoint taken there resumed
at a position already delivered (one batch twice, found by the resume fuzzer with
``--modes snapshots``, seed 871).
"""

from __future__ import annotations

import pickle

import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)

pytestmark = pytest.mark.timeout(60)


def build(path):
    return IterableWrapper(range(8)).sharding_filter().batch(4).snapshot(str(path))


def service(strategy):
    extra = {"chunk_size": 1} if strategy == "chunked" else {"num_batch_workers": 2}
    return MultiProcessingReadingService(
        1, start_method="fork", strategy=strategy, persistent_workers=True, **extra
    )


@pytest.mark.parametrize(("first", "then"), [("chunked", "economic"), ("economic", "chunked")])
def test_a_state_after_every_batch_resumes_to_nothing_more(tmp_path, first, then):
    with DataLoader(build(tmp_path), InProcessReadingService(), seed=1) as writing:
        assert list(writing) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with DataLoader(build(tmp_path), service(first), seed=1) as stopped:
        batches = iter(stopped)
        assert [next(batches), next(batches)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        state = pickle.loads(pickle.dumps(stopped.state_dict()))
    with DataLoader(build(tmp_path), service(then), seed=1) as resumed:
        resumed.load_state_dict(state)
        assert list(resumed) == []
        assert list(resumed) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def fan(x):
    return [x * 10 + j for j in range(5)]


@pytest.mark.filterwarnings("ignore:.*reads its upstream live here:UserWarning")  # (workers')
def test_batches_across_positions_written_in_process_read_under_workers_as_written(tmp_path):
    # A batch after a flatmap spans positions ([4, 10]); workers build such batches from the
    # runs of positions the service gives them, which the records do not follow. Each
    # worker read the records of its positions: batches twice, others lost.
    def build():
        pipe = IterableWrapper(range(3)).sharding_filter().flatmap(fan).batch(2)
        return pipe.snapshot(str(tmp_path))

    with DataLoader(build(), InProcessReadingService(), seed=1) as writing:
        written = list(writing)
    assert [4, 10] in written
    workers = MultiProcessingReadingService(2, start_method="fork")
    with DataLoader(build(), workers, seed=1) as reading:
        assert list(reading) == written


def test_a_frozen_shuffle_read_after_the_workers_merge_replays_its_order(tmp_path):
    # allow_random=True froze epoch 0's order. The reader after the workers' merge learns the
    # stamp from one live item, whose position (this epoch's order) differed from the first
    # record's: it raised "the upstream changed", or gave that live item as the first one.
    def build():
        pipe = IterableWrapper(range(12)).sharding_filter().shuffle(buffer_size=12)
        return pipe.snapshot(str(tmp_path), allow_random=True)

    with DataLoader(build(), InProcessReadingService(), seed=2) as writing:
        frozen = list(writing)
    assert frozen != sorted(frozen)
    with DataLoader(build(), ThreadReadingService(2), seed=2) as reading:
        reading.set_epoch(1)
        assert list(reading) == frozen
