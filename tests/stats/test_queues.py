"""``loader.stats().queues``: every queue of the plan, read when the consumer asked.

A slow consumer finds its queues full, a slow stage finds them empty; the
bytes counted are the bytes of the batches sent; each placement names its
queues. Stages and the consumer sleep (work that is the same everywhere);
the bounds are generous and nothing is asserted about speed.
"""

from __future__ import annotations

import time

import pytest
import torch

import pipeloom
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from pipeloom.stats import LoaderStats, QueueStats, shared_memory_in_use
from tests.reading_service.test_separate import InOwnProcess

pytestmark = pytest.mark.timeout(90)


def fast(x):
    return x


def slow(x):
    time.sleep(0.02)
    return x


def tensor(x):
    return torch.full((1024,), float(x))  # 4 KiB


def run(pipe, service, *, step: float) -> LoaderStats:
    with pipeloom.DataLoader(pipe, service, seed=0, stats=True) as loader:
        for _ in loader:
            time.sleep(step)
    return loader.stats()


def to_main(stats: LoaderStats) -> list[QueueStats]:
    queues = [q for q in stats.queues if q.name.endswith("-> main")]
    assert queues, stats.queues
    return queues


SERVICES = {
    "threads": lambda: ThreadReadingService(2, prefetch_factor=4),
    "classic": lambda: MultiProcessingReadingService(2, prefetch_factor=4, timeout=60),
}


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_a_slow_consumer_finds_its_queues_full(name):
    stats = run(IterableWrapper(range(60)).sharding_filter().map(fast), SERVICES[name](), step=0.02)
    queues = to_main(stats)
    assert max(q.mean_fill for q in queues) >= 0.5, queues
    assert max(q.full_share for q in queues) >= 0.3, queues


@pytest.mark.parametrize(
    "service",
    [lambda: ThreadReadingService(1), lambda: MultiProcessingReadingService(1, timeout=60)],
    ids=["threads", "classic"],
)
def test_a_slow_stage_leaves_its_queue_empty(service):
    # one worker: with several, the merge waits for one while the next one's queue fills
    stats = run(IterableWrapper(range(40)).sharding_filter().map(slow), service(), step=0)
    queues = to_main(stats)
    samples = sum(q.samples for q in queues)
    empty = sum(q.empty_share * q.samples for q in queues) / samples
    assert empty >= 0.7, queues
    assert stats.loader_bound, stats


def test_the_bytes_counted_are_the_bytes_of_the_batches_sent():
    batches, size = 24, 8
    pipe = IterableWrapper(range(batches * size)).sharding_filter().map(tensor).batch(size)
    service = MultiProcessingReadingService(2, timeout=60)
    stats = run(pipe.collate(), service, step=0.015)  # every next() samples (period 10 ms)
    queues = to_main(stats)
    sent = batches * size * 4096
    moved = sum(q.bytes_moved for q in queues)
    messages = sum(q.messages for q in queues)
    assert messages >= batches, queues
    assert sent <= moved <= sent + messages * 4096, (moved, sent, queues)
    assert sum(q.bytes_via_shm for q in queues) >= sent, queues  # tensors go through segments
    assert max(q.shm_peak_mib for q in queues) > 0, queues


def test_thread_queues_move_references_not_bytes():
    stats = run(
        IterableWrapper(range(20)).sharding_filter().map(tensor), SERVICES["threads"](), step=0
    )
    assert all(q.kind == "thread" and q.bytes_moved == 0 for q in to_main(stats))


@pytest.mark.parametrize(
    ("service", "names"),
    [
        (lambda: ThreadReadingService(2), ["worker thread 0 -> main", "worker thread 1 -> main"]),
        (
            lambda: MultiProcessingReadingService(2, timeout=60),
            ["worker process 0 -> main", "worker process 1 -> main"],
        ),
        (
            lambda: MultiProcessingReadingService(2, strategy="economic", timeout=60),
            ["tasks -> item worker 0", "item worker 1 -> main"],
        ),
        (
            lambda: MultiProcessingReadingService(
                2, strategy="economic", num_batch_workers=2, timeout=60
            ),
            ["tasks -> item worker 0", "control -> batch worker 1", "batch worker 0 -> main"],
        ),
        (
            lambda: MultiProcessingReadingService(2, strategy="chunked", timeout=60),
            ["tasks -> item worker 1", "item worker 0 -> main"],
        ),
    ],
)
def test_every_placement_names_its_queues(service, names):
    pipe = IterableWrapper(range(64)).sharding_filter().map(tensor).batch(8).collate()
    stats = run(pipe, service(), step=0.012)
    found = {q.name for q in stats.queues}
    assert set(names) <= found, found
    assert "queue" in str(stats) and names[0] in str(stats)
    assert stats.to_dict()["queues"][0]["name"] in found


def test_a_separate_process_block_reports_its_queue():
    side = InOwnProcess(IterableWrapper(range(8)).map(slow))
    pipe = IterableWrapper(range(8)).sharding_filter().map(fast).zip(side)
    stats = run(pipe, ThreadReadingService(2), step=0.01)
    names = [q.name for q in stats.queues]
    assert any(n.startswith("separate process InOwnProcess") for n in names), names


def test_in_process_has_no_queues_and_shared_memory_is_returned():
    before = shared_memory_in_use()
    stats = run(IterableWrapper(range(10)).batch(2), None, step=0)
    assert stats.queues == ()
    pipe = IterableWrapper(range(64)).sharding_filter().map(tensor).batch(16).collate()
    run(pipe, MultiProcessingReadingService(2, timeout=60), step=0.01)
    assert shared_memory_in_use() <= before  # the queues' segments went with the loader


def test_a_long_run_keeps_the_last_hour_of_queue_timeline():
    from pipeloom.queues import ThreadQueue
    from pipeloom.stats._queues import WINDOW_S as WINDOW
    from pipeloom.stats._queues import QueueWatch

    kept = int(3600 / WINDOW)  # the last hour
    queue = ThreadQueue(capacity=2)
    watch = QueueWatch(lambda: [("worker -> main", queue)], period=0.0, started=0.0)
    for index in range(kept + 100):  # one sample per half second for an hour and 50 s
        watch.sample(index * WINDOW)
    (stats,) = watch.summary()
    assert len(stats.timeline) == kept  # was one point per half second since the start
    assert stats.timeline[0][0] == 100 * WINDOW  # the oldest went
    assert stats.samples == kept + 100  # the totals still cover the whole run
