"""A queue between two threads of one process; items pass by reference."""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any

from pipeloom.errors import NotAvailable
from pipeloom.events import ReadinessSource, Signal
from pipeloom.queues._base import (
    DataLoaderQueue,
    Deadline,
    QueueBroken,
    QueueClosed,
    QueueState,
    QueueStatistics,
    Role,
    validate_capacity,
)
from pipeloom.queues._binding import ThreadBinding

__all__ = ["ThreadQueue"]


class ThreadQueue(DataLoaderQueue):
    """A bounded queue between a producer thread and a consumer thread.

    Items are passed by reference (no copy). Blocking calls wait on a
    ``threading.Condition`` and release the GIL. Each end binds to the first
    thread that uses it. If a bound thread exits without closing the queue,
    the other end raises :class:`QueueBroken` (after draining what was put).

    Args:
        capacity: the most items in flight before ``put`` waits.
        any_consumer_thread: let any thread ``get``, one at a time (the caller
            makes sure of that, e.g. a loader's iterator read from two threads
            under its lock); the consumer end then binds to no thread.
        wake_on_request: a ``put`` fires :meth:`readiness` only after the
            consumer called :meth:`request_item` (once per call), not on every
            item: a consumer reading several queues is then woken by the one it
            waits for, not by the others. Closing and a peer's exit always fire.

    Example:
        >>> q = ThreadQueue(capacity=1)
        >>> q.put(1)
        >>> q.put(2, block=False)
        Traceback (most recent call last):
        ...
        pipeloom.errors.NotAvailable: ThreadQueue is full (capacity 1)
        >>> q.get(), q.qsize()
        (1, 0)
    """

    kind = "thread"

    def __init__(
        self, capacity: int = 2, *, any_consumer_thread: bool = False, wake_on_request: bool = False
    ) -> None:
        self._capacity = validate_capacity(capacity)
        self._any_consumer_thread = any_consumer_thread
        self._wake_on_request = wake_on_request
        self._requested = False
        self._items: collections.deque[Any] = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._closed_by: str | None = None
        self._gone: str | None = None
        self._puts = 0
        self._gets = 0
        self._put_waits = 0
        self._item_signal = Signal()
        self._space_signal = Signal()
        ref = weakref.ref(self)
        self._binding = ThreadBinding(
            "ThreadQueue", lambda role, name: _thread_exited(ref, role, name)
        )

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def state(self) -> QueueState:
        return QueueState.CLOSED if self._closed_by or self._gone else QueueState.OPEN

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        deadline = Deadline(timeout)
        self._binding.check("producer")
        with self._cond:
            while True:
                self._raise_if_unusable("producer")
                if len(self._items) < self._capacity:
                    break
                if not block:
                    raise NotAvailable(f"ThreadQueue is full (capacity {self._capacity})")
                self._put_waits += 1
                if not self._cond.wait(deadline.remaining()) and deadline.expired():
                    raise TimeoutError(
                        f"ThreadQueue.put() timed out after {timeout}s: the queue stayed full "
                        f"(capacity {self._capacity}); is the consumer still getting items?"
                    )
            self._items.append(item)
            self._puts += 1
            self._cond.notify_all()
            wake = self._requested or not self._wake_on_request
            self._requested = False
        if wake:
            self._item_signal.fire()

    def request_item(self) -> None:
        """The consumer may wait for the next item: the next ``put`` fires :meth:`readiness`.

        Call it *before* trying a non-blocking ``get``, so that an item put in
        between wakes the consumer (no lost wake-up); only matters with
        ``wake_on_request``.
        """
        self._requested = True

    def cancel_request(self) -> None:
        """The consumer got what it wanted: puts need not wake it (``wake_on_request``)."""
        self._requested = False

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        deadline = Deadline(timeout)
        if not self._any_consumer_thread:
            self._binding.check("consumer")
        with self._cond:
            while not self._items:
                self._raise_if_unusable("consumer")
                if not block:
                    raise NotAvailable("ThreadQueue is empty")
                if not self._cond.wait(deadline.remaining()) and deadline.expired():
                    raise TimeoutError(
                        f"ThreadQueue.get() timed out after {timeout}s: no item arrived"
                    )
            item = self._items.popleft()
            self._gets += 1
            self._cond.notify_all()
        self._space_signal.fire()
        return item

    def _raise_if_unusable(self, role: Role) -> None:
        if self._closed_by is not None:
            raise QueueClosed(f"ThreadQueue was closed by the {self._closed_by}")
        if self._gone is not None and role == "consumer":
            raise QueueBroken(f"{self._gone} exited without closing the ThreadQueue")
        if self._gone is not None:
            raise QueueBroken(f"{self._gone} exited; nobody will get this item")

    def close(self) -> None:
        """Close the queue; idempotent. Items already put can still be got."""
        with self._cond:
            if self._closed_by is None:
                self._closed_by = _closer_name(self._binding)
            self._cond.notify_all()
        self._item_signal.fire()
        self._space_signal.fire()

    def _peer_exited(self, role: Role, name: str) -> None:
        with self._cond:
            if self._closed_by is None and self._gone is None:
                self._gone = f"{role} thread {name!r}"
            self._cond.notify_all()
        self._item_signal.fire()
        self._space_signal.fire()

    def readiness(self) -> ReadinessSource:
        return self._item_signal

    def space_readiness(self) -> ReadinessSource:
        return self._space_signal

    @property
    def put_waits(self) -> int:
        """How many times a ``put`` waited for space (the consumer was behind)."""
        return self._put_waits

    def qsize(self) -> int:
        return len(self._items)

    def statistics(self) -> QueueStatistics:
        with self._cond:
            return QueueStatistics(
                kind=self.kind,
                state=self.state.value,
                qsize=len(self._items),
                capacity=self._capacity,
                puts=self._puts,
                gets=self._gets,
            )


def _closer_name(binding: ThreadBinding) -> str:
    me = threading.get_ident()
    for role in ("producer", "consumer"):
        bound = binding._threads.get(role)  # noqa: SLF001 - same package
        if bound is not None and bound[0] == me:
            return f"{role} thread {bound[1]!r}"
    return f"thread {threading.current_thread().name!r}"


def _thread_exited(ref: weakref.ref[ThreadQueue], role: Role, name: str) -> None:
    queue = ref()
    if queue is not None:
        queue._peer_exited(role, name)  # noqa: SLF001
