"""``threadpool_map``: ``map`` with the calls running in a pool of threads, order kept."""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..errors import NotAvailable
from ..events import ReadinessSource, Signal
from ._base import IterDataPipe
from ._context import add_thread_draws, current_stamp, restore_stamp, thread_draws
from ._held import HeldShare, HoldsItems, held_stamped_items
from ._map import Col, fn_name, make_map_function, raise_with_note
from ._state_fields import StateFields

__all__ = ["ThreadPoolMapper"]


def _call(apply: Callable[[Any], Any], item: Any, stamp: tuple) -> tuple[Any, tuple, int]:
    """``apply(item)`` in a pool thread: (its result, the item's stamp after, draws made)."""
    restore_stamp(stamp)  # item_rng() in the pool thread draws for this item
    before = thread_draws()
    result = apply(item)
    return result, current_stamp(), thread_draws() - before


class ThreadPoolMapper(IterDataPipe, HoldsItems):
    """Apply ``fn`` like ``map``, up to ``scheduled_tasks`` items ahead in threads.

    Functional: ``threadpool_map``. For functions that wait (network, disk)
    or release the GIL. Results come out in the input order; the block never
    blocks: when the next result is not ready it raises ``NotAvailable`` and
    its signal fires as soon as a call finishes. ``item_rng()`` inside ``fn``
    draws for the item being processed, in whichever thread runs it, and its
    draws count for the item as ``map``'s do (a block after it draws the next
    seeds; ``in_memory_cache`` sees them). A
    checkpoint saves the items in flight; a resumed pipeline runs them again
    (on another number of ranks, each new rank runs its share of the old
    ranks' items before it reads more: ``HoldsItems``).

    Args:
        source: the upstream block.
        fn: the function, with ``input_col``/``output_col`` as in ``map``.
        scheduled_tasks: items submitted ahead of the one to yield.
        max_workers: threads in the pool (``ThreadPoolExecutor``'s default if None).
        **threadpool_kwargs: more ``ThreadPoolExecutor`` arguments
            (``thread_name_prefix``, ``initializer``...).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper(range(6)).threadpool_map(lambda x: x * x, max_workers=3))
        [0, 1, 4, 9, 16, 25]
    """

    inputs = ("source",)
    per_rank_fields = ("scheduled_tasks", "max_workers", "threadpool_kwargs")
    per_item = True
    one_to_one = True

    def __init__(
        self,
        source: IterDataPipe,
        fn: Callable[..., Any],
        input_col: Col = None,
        output_col: Col = None,
        scheduled_tasks: int = 128,
        max_workers: int | None = None,
        **threadpool_kwargs: Any,
    ) -> None:
        if (
            isinstance(scheduled_tasks, bool)
            or not isinstance(scheduled_tasks, int)
            or scheduled_tasks < 1
        ):
            raise ValueError(f"scheduled_tasks must be an int >= 1, got {scheduled_tasks!r}")
        if max_workers is not None and (
            isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1
        ):
            raise ValueError(f"max_workers must be an int >= 1 or None, got {max_workers!r}")
        try:  # starts no thread (they start with the first task); 3.14 checks in prepare_context
            ThreadPoolExecutor(max_workers, **threadpool_kwargs).shutdown(wait=False)
        except TypeError as error:
            raise TypeError(
                f"threadpool_map() passes {sorted(threadpool_kwargs)} to ThreadPoolExecutor, "
                f"which rejects them: {error}"
            ) from None
        self.source, self.fn, self.input_col, self.output_col = source, fn, input_col, output_col
        self.scheduled_tasks = scheduled_tasks
        self.max_workers = max_workers
        self.threadpool_kwargs = threadpool_kwargs
        self._apply = make_map_function(fn, input_col, output_col, owner="threadpool_map")
        self._signal = Signal()
        self._executor: ThreadPoolExecutor | None = None
        self._tasks: deque[tuple[Future, tuple, Any]] = deque()  # (future, stamp, item)
        self._replay: list[tuple[Any, tuple]] = []  # items in flight at a checkpoint
        self._ended = False

    def readiness_sources(self) -> Sequence[ReadinessSource]:
        return (self._signal,)

    def _submit(self, item: Any, stamp: tuple) -> None:
        if self._executor is None:
            executor = ThreadPoolExecutor(self.max_workers, **self.threadpool_kwargs)
            weakref.finalize(self, executor.shutdown, wait=False, cancel_futures=True)
            self._executor = executor
        future = self._executor.submit(_call, self._apply, item, stamp)
        signal = self._signal
        future.add_done_callback(lambda _done: signal.fire())
        self._tasks.append((future, stamp, item))

    def async_next(self) -> Any:
        tasks = self._tasks
        while self._replay and len(tasks) < self.scheduled_tasks:
            self._submit(*self._replay.pop(0))
        while not self._ended and len(tasks) < self.scheduled_tasks:
            try:
                item = self.source.async_next()
            except NotAvailable:
                if not tasks:
                    raise
                break
            except StopIteration:
                self._ended = True
                break
            self._submit(item, current_stamp())
        if not tasks:
            raise StopIteration
        future, stamp, _ = tasks[0]
        if not future.done():
            raise NotAvailable
        tasks.popleft()
        try:
            result, stamp, draws = future.result()
        except Exception as error:
            raise_with_note(error, self, stamp[2])
        # the draws made in the pool thread count as this thread's, as map's do: a block
        # downstream draws the item's next seeds, and a cache sees that the item drew
        restore_stamp(stamp)
        add_thread_draws(draws)
        return result

    def reset(self) -> None:
        for future, _, _ in self._tasks:
            future.cancel()
        self._tasks = deque()
        self._replay = []
        self._ended = False

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        in_flight = [(item, stamp) for _, stamp, item in self._tasks]  # submitted first
        return {"in_flight": in_flight + self._replay, "ended": self._ended}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        replay, ended = fields.stamped_items("in_flight"), fields.bool("ended")
        self.reset()
        self._replay, self._ended = replay, ended

    def load_held_states(
        self, states: list[dict[str, Any]], share: HeldShare | None = None
    ) -> None:
        """This rank's share of the items in flight, run again before it reads more."""
        in_flight = held_stamped_items(self, states, "in_flight", share)
        self.load_state_dict({"in_flight": in_flight, "ended": False})

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_replay"] = self.state_dict()["in_flight"]
        state["_tasks"], state["_executor"] = deque(), None
        return state

    def __repr__(self) -> str:
        return (
            f"ThreadPoolMapper(fn={fn_name(self.fn)}, scheduled_tasks={self.scheduled_tasks}, "
            f"max_workers={self.max_workers})"
        )
