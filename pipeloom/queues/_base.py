"""The queue interface every implementation follows, and its shared records.

A :class:`DataLoaderQueue` joins exactly two endpoints: one producer calling
:meth:`~DataLoaderQueue.put` and one consumer calling
:meth:`~DataLoaderQueue.get`. Blocking calls are built on the non-blocking
ones (as in trio's channels): ``block=False`` raises
:class:`~pipeloom.errors.NotAvailable` instead of waiting, and waiting sleeps
on an event or a file descriptor, never in a polling loop.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import math
import time
from typing import Any, Literal

import torch

from pipeloom._validate import check_int
from pipeloom.errors import QueueError
from pipeloom.events import ReadinessSource

__all__ = [
    "DataLoaderQueue",
    "QueueBroken",
    "QueueClosed",
    "QueueState",
    "QueueStatistics",
]

Role = Literal["producer", "consumer"]


class QueueClosed(QueueError):
    """The queue was closed on purpose, by this end or by its peer.

    A consumer sees it only after it has received every item put before the
    close, so it doubles as the clean "end of queue" signal.
    """


class QueueBroken(QueueError):
    """The peer went away without closing the queue (crash, signal, exit)."""


class QueueState(enum.Enum):
    """Lifecycle of a queue as seen from one process."""

    OPEN = "open"
    CLOSED = "closed"


@dataclasses.dataclass(frozen=True)
class QueueStatistics:
    """A snapshot of one queue, as returned by ``statistics()``.

    Attributes:
        kind: the implementation, e.g. ``"thread"``.
        state: ``"open"`` or ``"closed"`` (as seen from the caller).
        qsize: items put and not yet got.
        capacity: the most items in flight before ``put`` waits.
        puts: items put so far.
        gets: items got so far.
        bytes_via_shm: payload bytes moved through shared memory.
        segments_created: shared-memory segments created.
        segments_reused: messages that reused a pooled segment.
        bytes_inline: payload bytes sent through the socket itself.
        shm_bytes_held: bytes of the shared-memory segments the producer holds
            now (lent to the consumer or pooled for reuse).
        bytes_uncopied: the part of ``bytes_via_shm`` the producer built in
            shared memory itself (``empty_tensor``), so put() copied none of it.
    """

    kind: str
    state: str
    qsize: int
    capacity: int
    puts: int
    gets: int
    bytes_via_shm: int = 0
    segments_created: int = 0
    segments_reused: int = 0
    bytes_inline: int = 0
    shm_bytes_held: int = 0
    bytes_uncopied: int = 0


def validate_capacity(capacity: int) -> int:
    """Check a queue capacity once, at construction."""
    check_int("capacity", capacity)
    if capacity < 1:
        raise ValueError(
            f"capacity must be >= 1, got {capacity}; a queue needs room for at least "
            "one item in flight"
        )
    return capacity


class Deadline:
    """Turns ``(block, timeout)`` into the time left to wait.

    ``remaining()`` is None for "wait forever", else seconds (>= 0).
    """

    __slots__ = ("_end", "timeout")

    def __init__(self, timeout: float | None) -> None:
        if timeout is not None:
            if not isinstance(timeout, (int, float)) or math.isnan(timeout):
                raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
            if timeout < 0:
                raise ValueError(
                    f"timeout must be >= 0 seconds or None, got {timeout}; "
                    "use block=False to not wait at all"
                )
        self.timeout = timeout
        self._end = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> float | None:
        if self._end is None:
            return None
        return max(0.0, self._end - time.monotonic())

    def expired(self) -> bool:
        return self._end is not None and time.monotonic() >= self._end


class DataLoaderQueue(abc.ABC):
    """A bounded FIFO between exactly two endpoints: a producer and a consumer.

    Guarantees: every item put is got once (no loss, no duplicates), in the
    order it was put; at most ``capacity`` items are in flight (a full queue
    makes ``put`` wait, or raise ``NotAvailable`` with ``block=False``).

    Errors:
        NotAvailable: ``block=False`` and the queue is empty (``get``) or full (``put``).
        TimeoutError: ``timeout`` seconds passed before the call could complete.
        QueueClosed: the queue was closed (after close, ``get`` still returns
            the items already delivered, then raises).
        QueueBroken: the peer died without closing; the message names it.

    Example:
        >>> from pipeloom.queues import ThreadQueue
        >>> with ThreadQueue(capacity=2) as q:
        ...     q.put("a")
        ...     q.get()
        'a'
    """

    kind: str = "abstract"

    @property
    @abc.abstractmethod
    def capacity(self) -> int:
        """The most items in flight before ``put`` waits."""

    @property
    @abc.abstractmethod
    def state(self) -> QueueState:
        """``QueueState.OPEN`` or ``QueueState.CLOSED`` (from the caller's side)."""

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called here or the peer closed."""
        return self.state is QueueState.CLOSED

    @abc.abstractmethod
    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Append ``item``, waiting for room if the queue is full.

        Raises:
            NotAvailable: ``block=False`` and the queue is full.
            TimeoutError: no room within ``timeout`` seconds.
            QueueError: the queue is closed or the consumer is gone.
        """

    @abc.abstractmethod
    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Remove and return the oldest item, waiting for one if empty.

        Raises:
            NotAvailable: ``block=False`` and nothing is ready.
            TimeoutError: nothing arrived within ``timeout`` seconds.
            QueueError: the queue is closed (and drained) or the producer is gone.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Close the queue; idempotent. The peer sees ``QueueClosed``."""

    @abc.abstractmethod
    def readiness(self) -> ReadinessSource:
        """What a consumer's :class:`~pipeloom.events.Waiter` attaches to.

        It reports progress when an item may be ready, or when the queue was
        closed or broke; after a wake-up, ``get(block=False)`` either returns,
        raises ``QueueError``, or consumes the event (no busy loop).
        """

    @abc.abstractmethod
    def space_readiness(self) -> ReadinessSource:
        """What a producer's waiter attaches to, to learn that room was made."""

    def empty_tensor(
        self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """An uninitialised tensor for the producer to fill and put (in an item).

        Queues that copy items into shared memory (:class:`ProcessQueue`)
        return one that already lies there, so putting it copies nothing;
        the others return ``torch.empty(shape, dtype=dtype)``.

        Example:
            >>> from pipeloom.queues import ThreadQueue
            >>> ThreadQueue(capacity=1).empty_tensor((2, 3)).shape
            torch.Size([2, 3])
        """
        return torch.empty(shape, dtype=dtype)

    @abc.abstractmethod
    def qsize(self) -> int:
        """Items put and not yet got (a snapshot)."""

    @abc.abstractmethod
    def statistics(self) -> QueueStatistics:
        """A frozen snapshot of the queue's counters."""

    def __enter__(self) -> DataLoaderQueue:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self.capacity}, "
            f"state={self.state.value}, qsize={self.qsize()})"
        )
