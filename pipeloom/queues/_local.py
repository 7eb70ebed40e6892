"""A queue whose producer and consumer are the same thread; by reference."""

from __future__ import annotations

import collections
from typing import Any

from pipeloom.errors import NotAvailable
from pipeloom.events import ReadinessSource, Signal
from pipeloom.queues._base import (
    DataLoaderQueue,
    Deadline,
    QueueClosed,
    QueueState,
    QueueStatistics,
    validate_capacity,
)
from pipeloom.queues._binding import ThreadBinding

__all__ = ["LocalQueue"]


class LocalQueue(DataLoaderQueue):
    """A bounded FIFO used by one thread as both producer and consumer.

    Items pass by reference. Because nobody else can change the queue while
    its only thread waits, a blocking ``get`` on an empty queue (or ``put`` on
    a full one) could never return: it raises ``RuntimeError`` at once instead
    of deadlocking. Use ``block=False`` and handle ``NotAvailable``.

    Args:
        capacity: the most items held before ``put`` refuses more.

    Example:
        >>> q = LocalQueue(capacity=2)
        >>> q.put("x"); q.get()
        'x'
        >>> q.get(block=False)
        Traceback (most recent call last):
        ...
        pipeloom.errors.NotAvailable: LocalQueue is empty
    """

    kind = "local"

    def __init__(self, capacity: int = 2) -> None:
        self._capacity = validate_capacity(capacity)
        self._items: collections.deque[Any] = collections.deque()
        self._closed = False
        self._puts = 0
        self._gets = 0
        self._item_signal = Signal()
        self._space_signal = Signal()
        self._binding = ThreadBinding("LocalQueue", lambda role, name: None)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def state(self) -> QueueState:
        return QueueState.CLOSED if self._closed else QueueState.OPEN

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        Deadline(timeout)  # validates the argument
        self._check_thread()
        if self._closed:
            raise QueueClosed("LocalQueue is closed; put() after close() is not allowed")
        if len(self._items) >= self._capacity:
            if not block:
                raise NotAvailable(f"LocalQueue is full (capacity {self._capacity})")
            raise RuntimeError(
                f"LocalQueue.put(block=True) on a full queue (capacity {self._capacity}) would "
                "wait forever: its only thread is the one waiting. Get an item first, use "
                "put(block=False), or use a ThreadQueue between two threads"
            )
        self._items.append(item)
        self._puts += 1
        self._item_signal.fire()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        Deadline(timeout)
        self._check_thread()
        if not self._items:
            if self._closed:
                raise QueueClosed("LocalQueue is closed and drained")
            if not block:
                raise NotAvailable("LocalQueue is empty")
            raise RuntimeError(
                "LocalQueue.get(block=True) on an empty queue would wait forever: its only "
                "thread is the one waiting. Put an item first, use get(block=False), or use "
                "a ThreadQueue between two threads"
            )
        self._gets += 1
        item = self._items.popleft()
        self._space_signal.fire()
        return item

    def _check_thread(self) -> None:
        self._binding.check("producer")
        self._binding.check("consumer")

    def close(self) -> None:
        """Close the queue; idempotent. Items already put can still be got."""
        self._closed = True
        self._item_signal.fire()
        self._space_signal.fire()

    def readiness(self) -> ReadinessSource:
        return self._item_signal

    def space_readiness(self) -> ReadinessSource:
        return self._space_signal

    def qsize(self) -> int:
        return len(self._items)

    def statistics(self) -> QueueStatistics:
        return QueueStatistics(
            kind=self.kind,
            state=self.state.value,
            qsize=len(self._items),
            capacity=self._capacity,
            puts=self._puts,
            gets=self._gets,
        )
