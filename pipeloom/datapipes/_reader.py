"""Waiting for a block's next item on the readiness events of the blocks upstream."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..errors import NotAvailable
from ..events import ReadinessSource, Waiter
from ._interrupts import raise_if_interrupted, waiting

if TYPE_CHECKING:
    from ._base import IterDataPipe

__all__ = ["BlockingIterator", "BlockingReader", "waited_sources"]


def waited_sources(pipe: Any) -> list[ReadinessSource]:
    """The readiness sources to wait on for ``pipe``'s next item, ``pipe``'s own first.

    Walks upstream but not past a block that sets ``readiness_covers_upstream``
    (a ``prefetch``: its own thread reads its upstream and fires its signal on
    every item, end or error), so a consumer is not woken by progress that
    block's thread consumes; a block also reachable another way is still seen.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> pipe = IterableWrapper(range(3)).prefetch(2)
        >>> waited_sources(pipe) == list(pipe.readiness_sources())
        True
    """
    sources: list[ReadinessSource] = []
    seen: set[int] = set()
    stack = [pipe]
    while stack:
        block = stack.pop()
        if id(block) in seen:
            continue
        seen.add(id(block))
        sources += block.readiness_sources()
        if not getattr(block, "readiness_covers_upstream", False):
            stack += reversed(block.parents)
    return sources


class BlockingReader:
    """Waits for a block's items on its readiness events (never polls).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> BlockingReader(IterableWrapper([7])).next()
        7
    """

    def __init__(self, pipe: Any, *, between_items: bool = False) -> None:
        self.pipe = pipe
        self.between_items = between_items  # a wait here is between two items of a loader
        self._waiter: Waiter | None = None
        self._sources: list[ReadinessSource] = []

    def next(self, timeout: float | None = None) -> Any:
        """The next item of an iterable block; ``StopIteration`` at the end."""
        return self._call(self.pipe.async_next, (), timeout)

    def get(self, index: int, timeout: float | None = None) -> Any:
        """Item ``index`` of a map-style block."""
        return self._call(self.pipe.async_get, (index,), timeout)

    def _call(self, fn, args, timeout: float | None) -> Any:
        try:
            return fn(*args)
        except NotAvailable:
            pass
        waiter = self._attach()
        deadline = None if timeout is None else time.monotonic() + timeout
        with waiting(waiter):  # a shutdown() from another thread can wake it
            while True:
                seen = waiter.generation
                try:
                    return fn(*args)
                except NotAvailable:
                    pass
                # Wait outside the except clause: Ctrl-C while waiting (or a failing wait)
                # then shows alone, not "during handling of NotAvailable".
                raise_if_interrupted(self.between_items)
                left = None if deadline is None else deadline - time.monotonic()
                if (left is not None and left <= 0) or not waiter.wait(seen, left):
                    raise TimeoutError(f"no item from {self.pipe!r} within {timeout} s")

    def _attach(self) -> Waiter:
        if self._waiter is not None:
            return self._waiter
        sources = waited_sources(self.pipe)
        if not sources:
            raise RuntimeError(
                f"{self.pipe!r} raised NotAvailable, but no block upstream of it offers "
                f"a readiness source to wait on; a block that can raise NotAvailable must "
                f"return its Signal/FdReadiness from readiness_sources()"
            )
        waiter = Waiter()
        for source in sources:
            source.attach(waiter)
        self._waiter, self._sources = waiter, sources
        return waiter

    def close(self) -> None:
        """Detach from the readiness sources."""
        if self._waiter is not None:
            for source in self._sources:
                source.detach(self._waiter)
            self._waiter.close()
            self._waiter, self._sources = None, []

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


class BlockingIterator(Iterator[Any]):
    """What ``iter(block)`` returns for an async block."""

    __slots__ = ("_pipe", "_token", "_reader")

    def __init__(self, pipe: IterDataPipe) -> None:
        self._pipe = pipe
        self._token = pipe._iteration()
        self._reader: BlockingReader | None = None

    def __next__(self) -> Any:
        pipe = self._pipe
        if pipe._iteration() != self._token:
            raise RuntimeError(
                f"this iterator over {pipe!r} is no longer valid: the pipeline was "
                f"restarted by a newer iter() or reset. A block runs one iteration at a "
                f"time; use .fork(2) to consume the same stream twice. A block of yours "
                f"that keeps an iterator of its input across epochs (made in __init__ or "
                f"kept in an attribute) gets this at its next epoch: call iter() inside "
                f"its __iter__"
            )
        try:
            return pipe.async_next()
        except NotAvailable:
            if self._reader is None:
                self._reader = BlockingReader(pipe)
            return self._reader.next()
