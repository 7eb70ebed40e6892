import threading

import pytest

from pipeloom.errors import NotAvailable, QueueError
from pipeloom.events import Waiter
from pipeloom.queues import LocalQueue, QueueClosed


def test_items_come_out_in_order_by_reference():
    q = LocalQueue(capacity=3)
    items = [object(), object(), object()]
    for item in items:
        q.put(item)
    assert [q.get() for _ in items] == items
    assert q.qsize() == 0


def test_full_queue_refuses_without_blocking():
    q = LocalQueue(capacity=1)
    q.put(1)
    with pytest.raises(NotAvailable, match="full"):
        q.put(2, block=False)


@pytest.mark.parametrize("op", ["get", "put"])
def test_blocking_call_that_can_never_return_raises_instead_of_deadlocking(op):
    q = LocalQueue(capacity=1)
    if op == "put":
        q.put(0)
    with pytest.raises(RuntimeError, match="would wait forever"):
        q.get() if op == "get" else q.put(1)


def test_close_lets_the_remaining_items_be_got_then_raises():
    q = LocalQueue(capacity=2)
    q.put("a")
    q.close()
    q.close()  # idempotent
    with pytest.raises(QueueClosed):
        q.put("b")
    assert q.get() == "a"
    with pytest.raises(QueueError, match="closed"):
        q.get(block=False)


def test_another_thread_is_a_third_endpoint():
    q = LocalQueue()
    q.put(1)
    errors = []
    thread = threading.Thread(target=lambda: errors.append(_catch(q.get)))
    thread.start()
    thread.join(10)
    assert isinstance(errors[0], RuntimeError) and "exactly two endpoints" in str(errors[0])


def test_readiness_signal_wakes_a_waiter():
    q = LocalQueue()
    waiter = Waiter()
    q.readiness().attach(waiter)
    seen = waiter.generation
    q.put(1)
    assert waiter.wait(seen, timeout=0)


def test_negative_timeout_is_rejected():
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        LocalQueue().get(timeout=-1)


def test_capacity_is_validated():
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        LocalQueue(0)
    with pytest.raises(TypeError, match="capacity must be an int"):
        LocalQueue(2.5)


def _catch(fn):
    try:
        fn()
    except Exception as err:  # noqa: BLE001
        return err
    return None
