"""No shared memory or descriptor survives close, errors or SIGKILL."""

import multiprocessing as mp
import os

import pytest
import torch

from pipeloom.queues import ProcessQueue, QueueBroken
from tests.queues import queue_workers


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


def test_close_releases_every_descriptor(no_shm_leak):
    before = _open_fds()
    q = ProcessQueue(capacity=10)
    for i in range(10):
        q.put({"a": torch.full((10_000 * (i + 1),), 1.0)}, timeout=10)
    held = q.get(timeout=10)
    q.close()
    del q
    after_close = _open_fds()
    assert float(held["a"].sum()) == 10_000
    del held
    assert after_close - before <= 1  # at most the mapping `held` still uses
    assert _open_fds() == before


def test_producer_killed_mid_stream_breaks_the_consumer_promptly(no_shm_leak):
    ctx = mp.get_context("fork")
    q = ProcessQueue(capacity=2, owner="consumer")
    proc = ctx.Process(target=queue_workers.produce_then_die, args=(q, 5))
    proc.start()
    got = []  # each get() waits at most 10 s: a consumer that misses the death fails
    with pytest.raises(
        QueueBroken, match=rf"producer process {proc.pid} was killed by signal 9 \(SIGKILL\)"
    ):
        while True:
            got.append(q.get(timeout=10))
    proc.join(10)
    q.close()
    assert [float(t[0]) for t in got] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_consumer_killed_breaks_the_producer(no_shm_leak):
    ctx = mp.get_context("fork")
    q = ProcessQueue(capacity=2, owner="producer")
    ready = ctx.Event()
    proc = ctx.Process(target=queue_workers.consume_then_die, args=(q, 2, ready))
    proc.start()
    q.put(torch.ones(100_000), timeout=10)
    q.put(torch.ones(100_000), timeout=10)
    assert ready.wait(10)
    proc.join(10)
    with pytest.raises(QueueBroken, match="consumer process"):
        for _ in range(5):
            q.put(torch.ones(100_000), timeout=10)
    q.close()


def test_consumer_blocked_in_get_wakes_when_producer_is_killed_before_using_the_queue():
    ctx = mp.get_context("fork")
    q = ProcessQueue(owner="consumer")
    proc = ctx.Process(target=queue_workers.die_now)
    proc.start()
    with pytest.raises(QueueBroken, match="producer"):
        q.get(timeout=10)
    proc.join(10)
    q.close()
