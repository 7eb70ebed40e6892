"""Running the upstream ahead in a background thread."""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

from .._validate import check_int
from ..errors import NotAvailable
from ..events import ReadinessSource, Signal, Waiter
from ._base import IterDataPipe
from ._context import add_thread_draws, current_stamp, restore_stamp, thread_draws
from ._held import HeldShare, HoldsItems, held_stamped_items
from ._state_fields import StateFields

__all__ = ["Prefetcher"]


class Prefetcher(IterDataPipe, HoldsItems):
    """Pull up to ``buffer_size`` items ahead in a daemon thread (functional: ``prefetch``).

    The thread starts at the first ``async_next`` of an epoch, waits on the
    upstream's readiness events (it never polls), and fires this block's
    ``Signal`` whenever it stores an item, the end, or an exception, which is
    re-raised in the consumer with its traceback. ``reset()``, ``state_dict()``
    and garbage collection stop and join the thread. The state holds the
    buffered items themselves, saved while the thread is paused, so the
    upstream's state matches the buffer; the thread restarts on the next item.
    On a resume on another number of ranks each new rank takes its share of
    the old ranks' buffered items (``HoldsItems``); it reads ahead again
    once fewer than ``buffer_size`` are left.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(Prefetcher(IterableWrapper(range(5)), buffer_size=2))
        [0, 1, 2, 3, 4]
    """

    inputs = ("source",)
    per_rank_fields: ClassVar[tuple[str, ...]] = ("buffer_size",)
    readiness_covers_upstream = True  # its signal fires on every item its thread stores

    def __init__(self, source: IterDataPipe, buffer_size: int = 10) -> None:
        check_int(
            "buffer_size", buffer_size, minimum=1, hint="use buffer_size=1 to run one item ahead"
        )
        self.source = source
        self.buffer_size = buffer_size
        self._signal = Signal()
        self._worker: _Worker | None = None
        self._finalizer: weakref.finalize | None = None

    def readiness_sources(self) -> Sequence[ReadinessSource]:
        return (self._signal,)

    def _start(self) -> _Worker:
        worker = self._worker
        if worker is None:
            worker = self._worker = _Worker(self.source, self.buffer_size, self._signal, repr(self))
            self._finalizer = weakref.finalize(self, worker.stop)
        worker.start()
        return worker

    def async_next(self) -> Any:
        worker = self._worker
        if worker is None or not worker.running:
            worker = self._start()
        elif worker.pausing:
            worker.resume()
        with worker.lock:
            if worker.items:
                item, stamp = worker.items.popleft()
                draws = worker.draws.popleft()
                worker.space.notify()
            elif worker.error is not None:
                error, worker.error = worker.error, None
                worker.ended = True
                raise error
            elif worker.ended:
                raise StopIteration
            else:
                raise NotAvailable
        restore_stamp(stamp)
        # the item_rng() draws made for it in the thread count as this thread's (as map's
        # do): a cache downstream sees that the item drew, and replays its epoch to redo it
        add_thread_draws(draws)
        return item

    def _stop(self) -> None:
        if self._worker is not None:
            self._worker.stop()

    def reset(self) -> None:
        self._stop()
        if self._finalizer is not None:
            self._finalizer.detach()
        self._worker = self._finalizer = None

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        """Pause the thread and save the buffered items (their upstream state is saved after)."""
        worker = self._worker
        if worker is None:
            return {"items": [], "ended": False}
        # Park the thread between items (it stays alive, so anything bound to it,
        # such as a queue's consumer end, stays valid); the next async_next resumes it.
        worker.pause()
        return {"items": list(worker.items), "ended": worker.ended}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        items, ended = fields.stamped_items("items"), fields.bool("ended")
        self.reset()
        worker = self._start_paused()
        worker.items.extend(items)
        # (their draws are not saved: a cache after this block that drew nothing before
        # the state holds the whole epoch from its first item, and replays nothing live)
        worker.draws.extend([0] * len(items))
        worker.ended = ended

    def load_held_states(
        self, states: list[dict[str, Any]], share: HeldShare | None = None
    ) -> None:
        """This rank's share of the buffered items, passed on before it reads ahead."""
        items = held_stamped_items(self, states, "items", share)
        self.load_state_dict({"items": items, "ended": False})

    def _start_paused(self) -> _Worker:
        worker = self._worker = _Worker(self.source, self.buffer_size, self._signal, repr(self))
        self._finalizer = weakref.finalize(self, worker.stop)
        return worker

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_worker"] = state["_finalizer"] = None
        return state

    def __repr__(self) -> str:
        return f"Prefetcher(buffer_size={self.buffer_size})"


class _Worker:
    """The producer thread's state; holds no reference to its Prefetcher."""

    def __init__(self, source: IterDataPipe, buffer_size: int, signal: Signal, owner: str) -> None:
        self.source = source
        self.buffer_size = buffer_size
        self.signal = signal
        self.owner = owner
        self.lock = threading.Lock()
        self.space = threading.Condition(self.lock)
        self.items: deque[tuple[Any, Any]] = deque()
        self.draws: deque[int] = deque()  # item_rng() draws made for each of items, here
        self.ended = False
        self.error: BaseException | None = None
        self.stopping = False
        self.pausing = False
        self.parked = False
        self.running = False
        self.thread: threading.Thread | None = None
        self.waiter: Waiter | None = None
        self.sources: list[ReadinessSource] = []

    def start(self) -> None:
        self.running = True
        if self.ended or self.error is not None:
            return  # nothing left to produce
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name=f"pipeloom {self.owner}", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Ask the thread to stop, wake it wherever it waits, and join it."""
        with self.lock:
            self.stopping = True
            self.space.notify_all()
        if self.waiter is not None:
            self.waiter.wake()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self.thread = None
        self.running = False
        # An error nobody will read (e.g. the QueueClosed of an abandoned epoch) holds
        # the thread's frames, which hold this worker: a cycle only a collection frees.
        self.error = None

    def pause(self) -> None:
        """Park the thread between two items and wait until it is parked."""
        with self.lock:
            self.pausing = True
            self.space.notify_all()
        if self.waiter is not None:
            self.waiter.wake()
        with self.space:
            while not self.parked and self._thread_alive():
                self.space.wait(timeout=1.0)

    def resume(self) -> None:
        with self.space:
            self.pausing = self.parked = False
            self.space.notify_all()

    def _thread_alive(self) -> bool:
        thread = self.thread
        return thread is not None and thread.is_alive()

    def _run(self) -> None:
        try:
            self._produce()
        finally:
            self._detach()

    def _produce(self) -> None:
        items, space, signal = self.items, self.space, self.signal
        drawn = 0  # draws for the next item (also those before a pause while it waited)
        while True:
            with space:
                while (len(items) >= self.buffer_size or self.pausing) and not self.stopping:
                    if self.pausing and not self.parked:
                        self.parked = True
                        space.notify_all()  # tell pause() we are between items
                    space.wait()
                if self.stopping:
                    return
            before = thread_draws()
            try:
                item = self._pull()
            except StopIteration:
                with space:
                    self.ended = True
                signal.fire()
                return
            except BaseException as error:  # re-raised in the consumer
                if hasattr(error, "add_note"):
                    error.add_note(f"(raised upstream of {self.owner}, in its prefetch thread)")
                with space:
                    self.error = error
                signal.fire()
                return
            drawn += thread_draws() - before
            if item is _STOPPED:
                if self.stopping:
                    return
                continue  # asked to pause while waiting on the source: park
            with space:
                items.append((item, current_stamp()))
                self.draws.append(drawn)
            drawn = 0
            signal.fire()

    def _pull(self) -> Any:
        """The source's next item, waiting on its readiness events; ``_STOPPED`` on stop."""
        source = self.source
        try:
            return source.async_next()
        except NotAvailable:
            pass
        waiter = self._attach()
        while True:
            seen = waiter.generation
            if self.stopping or self.pausing:
                return _STOPPED
            try:
                return source.async_next()
            except NotAvailable:
                waiter.wait(seen)

    def _attach(self) -> Waiter:
        if self.waiter is not None:
            return self.waiter
        from ._reader import waited_sources

        sources = waited_sources(self.source)
        if not sources:
            raise RuntimeError(
                f"{self.source!r} raised NotAvailable, but no block upstream of it offers a "
                f"readiness source to wait on; return its Signal from readiness_sources()"
            )
        waiter = Waiter()
        for source in sources:
            source.attach(waiter)
        self.waiter, self.sources = waiter, sources
        return waiter

    def _detach(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            for source in self.sources:
                source.detach(waiter)
            waiter.close()
            self.waiter, self.sources = None, []


_STOPPED = object()
