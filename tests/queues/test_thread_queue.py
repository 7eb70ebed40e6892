import threading

import pytest

from pipeloom.errors import NotAvailable
from pipeloom.events import Waiter
from pipeloom.queues import QueueBroken, QueueClosed, ThreadQueue


def _run(target, *args):
    thread = threading.Thread(target=target, args=args)
    thread.start()
    return thread


def test_every_item_arrives_once_in_order_across_threads():
    q = ThreadQueue(capacity=3)

    def produce():
        for i in range(500):
            q.put(i, timeout=10)
        q.close()

    thread = _run(produce)
    got = []
    with pytest.raises(QueueClosed):
        while True:
            got.append(q.get(timeout=10))
    thread.join(10)
    assert got == list(range(500))


def test_put_waits_while_full_and_times_out():
    q = ThreadQueue(capacity=2)
    q.put(1)
    q.put(2)
    assert q.qsize() == q.capacity == 2
    with pytest.raises(NotAvailable):
        q.put(3, block=False)
    with pytest.raises(TimeoutError, match="stayed full"):
        q.put(3, timeout=0.05)


def test_get_timeout_raises_rather_than_returning_none():
    with pytest.raises(TimeoutError, match="no item arrived"):
        ThreadQueue().get(timeout=0.01)


def test_a_third_thread_cannot_attach():
    q = ThreadQueue()
    q.put(1)
    errors = []

    def second_producer():
        try:
            q.put(2)
        except RuntimeError as err:
            errors.append(err)

    _run(second_producer).join(10)
    assert "exactly two endpoints" in str(errors[0])


def test_producer_thread_exiting_without_close_breaks_the_queue_after_draining():
    q = ThreadQueue()
    _run(q.put, "last").join(10)
    assert q.get(timeout=10) == "last"
    with pytest.raises(QueueBroken, match="producer thread .* exited"):
        q.get(timeout=10)


def test_close_from_the_consumer_wakes_a_blocked_producer():
    q = ThreadQueue(capacity=1)
    first_put = threading.Event()
    errors = []

    def producer():
        q.put(0)
        first_put.set()
        try:
            q.put(1, timeout=10)  # blocks: the queue is full
        except QueueClosed as err:
            errors.append(err)

    thread = _run(producer)
    assert first_put.wait(10)
    q.close()
    thread.join(10)
    assert not thread.is_alive()
    assert errors and "closed" in str(errors[0])


def test_readiness_lets_a_consumer_sleep_until_an_item_arrives():
    q = ThreadQueue()
    waiter = Waiter()
    q.readiness().attach(waiter)
    seen = waiter.generation
    with pytest.raises(NotAvailable):
        q.get(block=False)
    _run(q.put, "x")
    assert waiter.wait(seen, timeout=10)
    assert q.get(block=False) == "x"


def test_statistics_is_a_frozen_record():
    q = ThreadQueue(capacity=4)
    q.put(1)
    stats = q.statistics()
    assert (stats.kind, stats.qsize, stats.capacity, stats.puts, stats.gets) == (
        "thread",
        1,
        4,
        1,
        0,
    )
    with pytest.raises(AttributeError):
        stats.qsize = 3


def test_wake_on_request_fires_only_for_a_requested_item():
    q = ThreadQueue(capacity=4, wake_on_request=True)
    waiter = Waiter()
    q.readiness().attach(waiter)
    q.put("ahead")  # nobody asked: the consumer is not woken
    assert waiter.generation == 0
    assert q.get(block=False) == "ahead"
    q.request_item()
    q.put("wanted")  # asked for: woken once
    q.put("next")
    assert waiter.generation == 1
    q.request_item()
    q.cancel_request()  # got it after all: no wake-up
    q.put("later")
    assert waiter.generation == 1
    q.close()  # closing always wakes
    assert waiter.generation == 2
    assert [q.get(block=False) for _ in range(3)] == ["wanted", "next", "later"]


def test_wake_on_request_loses_no_wake_up_across_threads():
    q = ThreadQueue(capacity=1, wake_on_request=True)
    waiter = Waiter()
    q.readiness().attach(waiter)
    n = 300
    producer = _run(lambda: [q.put(i) for i in range(n)])
    got = []
    while len(got) < n:
        seen = waiter.generation
        q.request_item()  # before the try, as WorkerThread.get_nowait does
        try:
            got.append(q.get(block=False))
        except NotAvailable:
            assert waiter.wait(seen, timeout=10), "a put did not wake the waiting consumer"
            continue
        q.cancel_request()
    producer.join(10)
    assert got == list(range(n))


def test_a_peer_exiting_wakes_even_without_a_request():
    q = ThreadQueue(wake_on_request=True)
    waiter = Waiter()
    q.readiness().attach(waiter)
    _run(q.put, "x").join(10)  # the producer thread ends without closing
    assert waiter.wait(0, timeout=10)
    assert q.get(block=False) == "x"
    with pytest.raises(QueueBroken):
        q.get(block=False)
