"""Memory the loader promises to bound, attacked from outside with 1 MiB items.

Each test counts what a block holds (its own counters), never the machine's memory.
"""

from __future__ import annotations

import multiprocessing
import threading
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.queues import ProcessQueue
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService

MIB = 1 << 20


@dataclass(slots=True)
class Sample:
    data: bytes
    label: int


KEEP_A_MIB = {
    "memoryview": lambda i: memoryview(bytearray(MIB)),
    "slots dataclass": lambda i: Sample(bytes(MIB), i),
    "array view": lambda i: np.zeros(MIB, np.uint8)[:16],  # a crop keeps the whole array
    "tensor view": lambda i: torch.zeros(MIB, dtype=torch.uint8)[:16],
    "array over bytes": lambda i: np.frombuffer(bytes(MIB), np.uint8)[:16],
}


@pytest.mark.parametrize("make", KEEP_A_MIB.values(), ids=KEEP_A_MIB.keys())
def test_in_memory_cache_counts_the_memory_each_item_keeps_alive(make):
    cache = IterableWrapper(range(40)).map(make).in_memory_cache(size=8)
    assert len(list(cache)) == 40
    assert cache.cached_items <= 8  # was 40 (40 MiB held under size=8): each counted ~0 bytes
    assert 7 * MIB <= cache.cached_bytes <= 8 * MIB


def test_in_memory_cache_counts_a_buffer_shared_by_items_once():
    table = torch.arange(4 * MIB, dtype=torch.uint8).reshape(64, -1)  # rows of 64 KiB
    cache = IterableWrapper(range(64)).map(table.__getitem__).in_memory_cache(size=8)
    assert len(list(cache)) == 64 and cache.cached_items == 64
    assert 4 * MIB <= cache.cached_bytes < 4 * MIB + 64 * 1024  # one storage, not 64
    assert list(cache)[5].data_ptr() == table[5].data_ptr()  # replayed from memory


def test_a_producer_pools_a_few_free_segments_of_all_sizes_together():
    with ProcessQueue(capacity=2) as queue:  # both ends here
        for size in [1 << k for k in range(17, 23)]:  # 128 KiB .. 4 MiB: six size classes
            held = []  # the consumer holds 4 items of this size, then drops them
            for _ in range(4):
                queue.put(np.ones(size, np.uint8))
                held.append(queue.get(timeout=10))
            del held
        queue.put(np.ones(1 << 17, np.uint8))
        queue.get(timeout=10)  # sends the consumer's FREEs
        queue.reclaim()  # the producer takes the freed segments back
        stats = queue.statistics()
        # capacity + 2 = 4 free segments in all (was 4 of every size: 31.5 MiB), + the lent one
        assert stats.shm_bytes_held <= 4 * (4 << 20) + (1 << 17)
        queue.put(np.ones(4 << 20, np.uint8))  # the most recently freed stay for reuse
        assert queue.get(timeout=10).nbytes == 4 << 20
        assert queue.statistics().segments_created == stats.segments_created


class _Produced:
    """Counts the items made, in any process (fork); the stalled first item waits on ``go``."""

    def __init__(self):
        self.count = multiprocessing.Value("i", 0)
        self.changed = multiprocessing.Condition()
        self.go = multiprocessing.Event()

    def __call__(self, index):
        if index == 0:
            self.go.wait(10)  # the first position's worker stalls
        with self.changed:
            self.count.value += 1
            self.changed.notify_all()
        return bytes(MIB)

    def __deepcopy__(self, memo):  # worker threads share it
        return self

    def exceeds(self, bound, seconds):
        with self.changed:
            return self.changed.wait_for(lambda: self.count.value > bound, seconds)


@pytest.mark.parametrize(
    "service",
    [
        lambda: ThreadReadingService(3, prefetch_factor=2),
        lambda: MultiProcessingReadingService(3, prefetch_factor=2, start_method="fork"),
    ],
    ids=["threads", "classic"],
)
def test_in_order_merge_behind_a_stalled_worker_holds_prefetch_factor_per_worker(service):
    produced = _Produced()
    pipe = IterableWrapper(range(60)).sharding_filter().map(produced)
    with DataLoader(pipe, service()) as loader:
        items = iter(loader)
        started = threading.Thread(target=next, args=(items,))  # waits for position 0
        started.start()
        try:  # the other workers may run ahead by what their queues hold, and one being made
            ran_ahead = produced.exceeds(2 * (2 + 1), seconds=0.5)  # the two other workers
        finally:
            produced.go.set()
            started.join(10)
        assert not ran_ahead, f"{produced.count.value} items made behind a stalled worker"
        assert sum(1 for _ in items) == 59
