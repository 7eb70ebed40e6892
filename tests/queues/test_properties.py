"""Delivery, no duplicates, order and the capacity bound, for random inputs."""

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.errors import NotAvailable
from pipeloom.queues import LocalQueue, ProcessQueue, ThreadQueue

items = st.lists(
    st.one_of(st.integers(), st.text(max_size=5), st.tuples(st.integers(), st.booleans())),
    max_size=40,
)
capacities = st.integers(min_value=1, max_value=6)


@pytest.mark.parametrize("kind", [LocalQueue, ProcessQueue])
@given(items=items, capacity=capacities)
@settings(max_examples=30, deadline=None)
def test_single_thread_delivers_everything_once_in_order_within_capacity(kind, items, capacity):
    with kind(capacity) as q:
        got, pending = [], list(items)
        while pending or q.qsize():
            try:
                q.put(pending[0], block=False) if pending else None
                pending.pop(0) if pending else None
            except NotAvailable:
                assert q.qsize() == capacity  # full means exactly full
                got.append(q.get(block=False))
                continue
            assert q.qsize() <= capacity
            if not pending:
                got.append(q.get(block=False))
        assert got == items


@given(items=items, capacity=capacities)
@settings(max_examples=20, deadline=None)
def test_threads_deliver_everything_once_in_order(items, capacity):
    q = ThreadQueue(capacity)
    thread = threading.Thread(target=lambda: [q.put(x, timeout=10) for x in items])
    thread.start()
    got = [q.get(timeout=10) for _ in items]
    thread.join(10)
    assert got == items
    assert q.statistics().puts == q.statistics().gets == len(items)
