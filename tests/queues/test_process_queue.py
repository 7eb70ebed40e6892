import multiprocessing as mp

import numpy as np
import pytest
import torch

from pipeloom.errors import NotAvailable, QueueError
from pipeloom.events import Waiter
from pipeloom.queues import ProcessQueue, QueueClosed
from tests.queues import queue_workers


def _drain(q):
    got = []
    with pytest.raises(QueueClosed, match="producer .* closed"):
        while True:
            got.append(q.get(timeout=10))
    return got


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_items_cross_processes_once_in_order_under_every_start_method(method):
    ctx = mp.get_context(method)
    q = ProcessQueue(capacity=3, owner="consumer")
    proc = ctx.Process(target=queue_workers.produce_payloads, args=(q, 20))
    proc.start()
    got = _drain(q)
    proc.join(10)
    q.close()
    assert [item["a"][1] for item in got] == list(range(20))
    for i, item in enumerate(got):
        assert item["t"].shape == (1000, 100) and float(item["t"][5, 5]) == i
        assert np.array_equal(item["a"][0], np.arange(30000) + i)


def test_lambdas_cross_under_spawn_through_cloudpickle():
    q = ProcessQueue(owner="consumer")
    proc = mp.get_context("spawn").Process(target=queue_workers.produce_lambda, args=(q,))
    proc.start()
    fn = q.get(timeout=20)
    proc.join(10)
    q.close()
    assert fn(1) == 6


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(24, dtype=torch.float32).reshape(2, 3, 4).transpose(0, 2),  # non-contiguous
        torch.tensor(3.5),  # 0-d
        torch.empty(0, 5),  # empty
        torch.ones(5000, dtype=torch.bool),
        torch.arange(5000, dtype=torch.int64),
        torch.randn(5000).half(),
        torch.randn(5000).bfloat16(),
    ],
    ids=["noncontig", "0d", "empty", "bool", "int64", "float16", "bfloat16"],
)
def test_tensors_keep_dtype_shape_and_values(tensor):
    with ProcessQueue() as q:
        q.put({"x": [tensor]})
        out = q.get(timeout=10)["x"][0]
    assert out.dtype == tensor.dtype and out.shape == tensor.shape
    assert torch.equal(out, tensor)


def test_tensor_requiring_grad_is_rejected_at_put():
    with ProcessQueue() as q, pytest.raises(TypeError, match="requires grad.*detach"):
        q.put(torch.ones(3, requires_grad=True))


def test_unpicklable_item_raises_at_put_naming_type_and_reason():
    import threading

    with ProcessQueue() as q:
        with pytest.raises(TypeError, match="'dict'.*not picklable.*lock"):
            q.put({"lock": threading.Lock()})
        q.put("still usable")
        assert q.get(timeout=10) == "still usable"


def test_received_tensor_stays_valid_after_close_and_segments_are_reused():
    q = ProcessQueue(capacity=2)
    kept = []
    for i in range(30):
        q.put(torch.full((50_000,), float(i)))
        out = q.get(timeout=10)
        if i == 3:
            kept.append(out)
    stats = q.statistics()
    q.close()
    assert float(kept[0].sum()) == 3 * 50_000
    assert stats.segments_created <= 4 and stats.segments_reused >= 26  # not one per message
    assert stats.bytes_via_shm >= 30 * 200_000


@pytest.mark.parametrize("pool_bytes, reused", [(0, False), (1 << 20, True)])
def test_pool_bytes_bounds_the_free_shared_memory_kept_for_reuse(pool_bytes, reused):
    with ProcessQueue(capacity=2, pool_bytes=pool_bytes) as q:
        for i in range(10):
            q.put(torch.full((50_000,), float(i)))  # 200 kB: a 256 KiB segment
            assert float(q.get(timeout=10)[0]) == i
        stats = q.statistics()
    if reused:
        assert stats.segments_created <= 3 and stats.segments_reused >= 7
    else:  # nothing kept: every message gets a fresh segment, freed when read
        assert stats.segments_created == 10 and stats.segments_reused == 0


def test_big_pickles_travel_through_shared_memory():
    with ProcessQueue() as q:
        big = list(range(100_000))
        q.put(big)
        assert q.get(timeout=10) == big
        assert q.statistics().bytes_via_shm > 0


def test_non_blocking_get_and_readiness_never_busy_spin():
    with ProcessQueue() as q:
        waiter = Waiter()
        q.readiness().attach(waiter)
        seen = waiter.generation
        with pytest.raises(NotAvailable):
            q.get(block=False)
        assert not waiter.wait(seen, timeout=0.05)  # nothing readable: it sleeps
        q.put("x")
        assert waiter.wait(seen, timeout=10)
        assert q.get(block=False) == "x"
        with pytest.raises(NotAvailable):
            q.get(block=False)
        assert not waiter.wait(waiter.generation, timeout=0.05)
        waiter.close()


def test_full_queue_blocks_exactly_at_capacity_and_times_out():
    with ProcessQueue(capacity=3) as q:
        for i in range(3):
            q.put(i, block=False)
        assert q.qsize() == 3
        with pytest.raises(NotAvailable, match="full"):
            q.put(3, block=False)
        with pytest.raises(TimeoutError, match="stayed full"):
            q.put(3, timeout=0.05)
        assert q.get(timeout=10) == 0
        q.put(3, block=False)
    with ProcessQueue() as q, pytest.raises(TimeoutError, match="no item arrived"):
        q.get(timeout=0.05)


def test_a_third_process_cannot_attach():
    ctx = mp.get_context("fork")
    q = ProcessQueue()
    out = ctx.Queue()
    first = ctx.Process(target=queue_workers.try_put, args=(q, out))
    second = ctx.Process(target=queue_workers.try_put, args=(q, out))
    first.start()
    first.join(10)
    second.start()
    second.join(10)
    results = [out.get(timeout=10), out.get(timeout=10)]
    out.close()
    out.join_thread()
    q.close()
    assert results[0] == "ok" and "exactly two endpoints" in results[1]


def test_closing_a_consumer_end_never_used_wakes_a_producer_waiting_for_room():
    # The loader's stop closes a worker's queue that the main process never read (the
    # merge had not reached it): the worker, blocked in put(), must hear it at once, not
    # wait to be killed (it holds a copy of the consumer's socket: no end-of-file).
    q = ProcessQueue(capacity=1, owner="consumer")
    ctx = mp.get_context("fork")
    out = ctx.SimpleQueue()
    proc = ctx.Process(target=queue_workers.put_until_refused, args=(q, out))
    proc.start()
    try:
        assert out.get() == "full"
        q.close()
        proc.join(5)
        assert proc.exitcode == 0, "the producer still waited for room after the close"
        assert out.get() == "QueueClosed"
    finally:
        proc.kill()
        proc.join()
        out.close()


def test_consumer_close_refuses_further_puts():
    q = ProcessQueue()
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=queue_workers.consume_all, args=(q, out))
    proc.start()
    q.put(torch.ones(10), timeout=10)
    q.put(None, timeout=10)
    assert out.get(timeout=10) == [10.0]
    proc.join(10)
    with pytest.raises(QueueError, match="consumer.* closed"):
        q.put(1, timeout=10)
    q.close()
    out.close()
    out.join_thread()
