"""The part of the pipeline an economic/chunked worker runs, once per task.

An item worker runs a copy of the per-item blocks with a :class:`TaskFeed`
in place of the sharding point; a batch worker runs a copy of ``batch`` and
the per-item blocks after it with a :class:`BatchFeed` in place of the item
workers. :class:`WorkerChain` restarts the copy for each task and collects
its outputs with their item stamps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ....datapipes import (
    BlockingReader,
    DataPipe,
    IterDataPipe,
    MapDataPipe,
    Mapper,
    set_pipeline_epoch,
)
from ....datapipes.runtime import (
    Head,
    RunReader,
    current_stamp,
    derive_seed,
    key_position,
    restart_blocks,
    restore_stamp,
    stamp_item,
)
from ....errors import NotAvailable
from ....graph import upstream
from ...workers.failure import Failure, capture_failure
from ...workers.messages import Output
from ...workers.rngs import global_rng_states, same_rng_states, seed_item_rngs

__all__ = ["BatchFeed", "TaskFeed", "WorkerChain"]

_GLOBAL_RNG_TAG = 0x610B
_KNOWN_SEED = 0x5EED  # the global RNGs' state before a task's unseeded run, when unknown


class TaskFeed(IterDataPipe):
    """Stands in for the sharding point in an item worker: yields one task's values.

    Each value is stamped with its source position, as the sharding point
    would have. With ``source`` (a map-style block the sharding point read by
    index) the value is the index and the item is read here.
    """

    inputs = ("source",)
    #: It stands in for the sharding point: a shardable block below it (``open_files``
    #: after ``sharding_filter``) passes these positions on instead of counting its own.
    stands_in_for_sharding_point = True
    #: Its stream is one task's part of the epoch: a snapshot below it reads by position.
    feeds_one_task = True

    def __init__(self, source: MapDataPipe | None = None) -> None:
        self.source = source
        self._entries: list[tuple[int, Any]] = []
        self._next = 0
        self._seed: int | None = None
        self.epoch = 0
        self.reseed = True  # seed the global RNGs per item (see ``WorkerChain.run``)

    def load(self, entries: list[tuple[int, Any]], seed: int | None) -> None:
        """Yield ``entries`` (``(position, value)`` pairs) next, stamped with ``seed``."""
        self._entries, self._next, self._seed = entries, 0, seed

    def async_next(self) -> Any:
        index = self._next
        if index >= len(self._entries):
            raise StopIteration
        key, value = self._entries[index]
        plain = key.__class__ is int and self.source is None
        if plain and (self._seed is None or not self.reseed):  # the common case: no reads
            stamp_item(self._seed, self.epoch, key)
            self._next = index + 1
            return value
        self._stamp(key)  # before the read: errors name it
        if self._seed is not None and self.reseed:  # global draws: by item, not worker
            parts = key if isinstance(key, tuple) else (key,)
            seed_item_rngs(derive_seed(self._seed, *parts, _GLOBAL_RNG_TAG))
        if self.source is None:
            item = value
        else:
            item = self.source.async_get(value)
            self._stamp(key)  # a source may stamp its own
        self._next += 1
        return item

    def _run_head(self) -> Head | None:
        """A fused run's head (``RunReader``) when the rest of the task is one plain run.

        Plain: positions that follow one another, read no item here and seed no
        global RNG per item, so each item is only stamped with its position (what
        ``async_next`` does for it) and the run's loop stamps it itself: no call
        per item here. Otherwise (keys, a map-style source, per-item seeding) the
        run reads ``async_next`` one item at a time.
        """
        if self.source is not None or (self._seed is not None and self.reseed):
            return None
        keys = [key for key, _ in self._entries[self._next :]]
        if not keys or set(map(type, keys)) != {int}:
            return None
        first = keys[0]
        if keys != list(range(first, first + len(keys))):
            return None
        return _TaskRun(self)

    def _stamp(self, key: Any) -> None:
        """Stamp the key the sharding point gave: ``p``, or ``(p, j, ...)``."""
        stamp_item(self._seed, self.epoch, key_position(key))  # type: ignore[arg-type]
        if isinstance(key, tuple):
            restore_stamp((self._seed, self.epoch, key, 0))

    def __repr__(self) -> str:
        return "TaskFeed()" if self.source is None else f"TaskFeed({self.source!r})"


class _TaskRun(Head):
    """A task's entries whose positions follow one another, read as one span."""

    def __init__(self, feed: TaskFeed) -> None:
        self.feed = feed
        self.stamper = self  # the loop stamps each item (seed, epoch, position, 0)

    def epoch_seed(self) -> int | None:
        return self.feed._seed

    def _epoch_number(self) -> int:
        return self.feed.epoch

    def span(self, count: int) -> tuple[list[Any], int, int] | None:
        feed = self.feed
        start = feed._next
        part = feed._entries[start : start + count]
        if not part:
            return None
        return [value for _, value in part], part[0][0], 1

    def advance(self, last: int) -> None:
        feed = self.feed
        feed._next += last - feed._entries[feed._next][0] + 1


class BatchFeed(IterDataPipe):
    """Stands in for the item workers in a batch worker: yields one batch's items."""

    inputs = ()
    feeds_one_task = True  # (see TaskFeed)

    def __init__(self) -> None:
        self._entries: list[tuple[int, int, Any]] = []
        self._next = 0
        self._seed: int | None = None
        self.epoch = 0

    def load(self, entries: list[tuple[int, int, Any]], seed: int | None) -> None:
        """Yield ``entries`` next, restoring their stamps."""
        self._entries, self._next, self._seed = entries, 0, seed

    def async_next(self) -> Any:
        if self._next >= len(self._entries):
            raise StopIteration
        key, draws, item = self._entries[self._next]
        if self._next == 0 and self._seed is not None:  # as for items: per batch, not worker
            position = key_position(key) or 0
            seed_item_rngs(derive_seed(self._seed, position, _GLOBAL_RNG_TAG + 1))
        self._next += 1
        restore_stamp((self._seed, self.epoch, key, draws))
        return item

    def async_next_many(self, limit: int) -> list[Any]:
        """The next up to ``limit`` items as one slice (``batch`` takes runs)."""
        start = self._next
        if start == 0 or start >= len(self._entries):
            return [self.async_next()]  # the first seeds the global RNGs; the end raises
        part = self._entries[start : start + limit]
        self._next = start + len(part)
        key, draws, _ = part[-1]
        restore_stamp((self._seed, self.epoch, key, draws))
        return [item for _, _, item in part]

    def __repr__(self) -> str:
        return "BatchFeed()"


class WorkerChain:
    """A worker's copy of its part of the pipeline, run once per task."""

    def __init__(self, pipe: IterDataPipe) -> None:
        self.pipe = pipe
        self._blocks: list[DataPipe] = upstream(pipe)
        feed = next(b for b in self._blocks if isinstance(b, (TaskFeed, BatchFeed)))
        self.feed: TaskFeed | BatchFeed = feed
        self._reader = BlockingReader(pipe)
        # An item worker's outputs come from a fused loop with a recorder at its end.
        self._recorder = Mapper(pipe, _with_stamp) if isinstance(feed, TaskFeed) else None
        if self._recorder is not None:
            self._blocks.insert(0, self._recorder)
            self._recorder_reader = BlockingReader(self._recorder)
        self.epochs: dict[int, tuple[int, int | None]] = {}  # gen -> (epoch, stamp seed)
        self._lazy = True  # no task has drawn from the global RNGs yet
        self._rng_states: tuple[Any, Any, Any] | None = None  # as the last task left them
        self._known_states: tuple[Any, Any, Any] | None = None  # seeded with _KNOWN_SEED
        #: The outputs the last :meth:`run` made before it failed (the batches they fill
        #: come before the error, as in-process).
        self.partial: list[Output] = []

    def start_epoch(self, gen: int, epoch: int, stamp_seed: int | None) -> None:
        self.epochs = {gen: (epoch, stamp_seed)}
        self._rng_states = None  # the worker reseeds its global RNGs at each epoch
        set_pipeline_epoch(self.pipe, epoch)
        self.feed.epoch = epoch

    def batch_size(self) -> int:
        """The size of the batches this chain builds (0 when it builds none)."""
        sizes = [b.batches_of() for b in self._blocks]
        return next((size for size in sizes if size is not None), 0)

    def global_rngs_moved(self) -> None:
        """Something outside this chain seeded or drew from the global RNGs since its
        last task (e.g. the batch part run after it): the next task reads them afresh."""
        self._rng_states = None

    def run(self, gen: int, entries: list, label: str) -> list[Output] | Failure:
        """Every output of the chain for ``entries``, or the failure it raised.

        An item worker seeds the global RNGs before each item, so an item's
        draws do not depend on the worker it lands on. That costs more than a
        cheap item, so a task first runs without it: when no global RNG moved,
        no item saw them and the outputs are those of the seeded run. Else the
        task runs again seeded, and so does every later task of this worker.
        """
        feed = self.feed
        if (
            self._lazy
            and isinstance(feed, TaskFeed)
            and len(entries) > 1
            and self.epochs[gen][1] is not None
        ):
            before = self._rng_states
            if before is None:  # unknown (the batch part seeded them): seed, not read
                before = self._seed_known_states()
            feed.reseed = False
            try:
                outputs = self._run(gen, entries, label)
            finally:
                feed.reseed = True
            self._rng_states = global_rng_states()  # the next task's "before": nothing between
            if same_rng_states(before, self._rng_states):
                return outputs
            self._lazy = False  # this pipeline draws from them: seed every item from now on
        return self._run(gen, entries, label)

    def _seed_known_states(self) -> tuple[Any, Any, Any]:
        """Seed the global RNGs with a fixed seed and return their states, read once.

        For the unseeded first run of a task, which keeps its outputs only when no
        item drew from them: what state they start in is then unseen, and seeding
        (about 10 µs) costs a third of reading the states (a task, ~25 µs saved).
        """
        seed_item_rngs(_KNOWN_SEED)
        if self._known_states is None:
            self._known_states = global_rng_states()
        return self._known_states

    def _run(self, gen: int, entries: list, label: str) -> list[Output] | Failure:
        _, stamp_seed = self.epochs[gen]
        outputs: list[Output] = []
        try:
            restart_blocks(self._blocks)
            self.feed.load(entries, stamp_seed)
            if self._recorder is not None:
                return self._run_fused(outputs, len(entries))
            reader = self._reader
            while True:
                try:
                    item = reader.next()
                except StopIteration:
                    return outputs
                stamp = current_stamp()
                outputs.append((stamp[2], stamp[3], item))
        except Exception as error:  # noqa: BLE001 - surfaced in the main process, in order
            self.partial = outputs  # held only past a failure: outputs pin shared memory
            return capture_failure(error, label)
        finally:
            self.feed.load([], stamp_seed)  # hold no item past its task

    def run_each(
        self, gen: int, entries: list, label: str, each: Callable[[Output], bool]
    ) -> Failure | None:
        """Call ``each`` on every output of the chain for ``entries`` as it is made (the
        global RNGs seeded per item); stop early when it returns False. The failure the
        chain raised, if any."""
        _, stamp_seed = self.epochs[gen]
        self._rng_states = None  # seeded per item here: the next task reads them afresh
        try:
            restart_blocks(self._blocks)
            self.feed.load(entries, stamp_seed)
            reader = self._reader
            while True:
                try:
                    item = reader.next()
                except StopIteration:
                    return None
                stamp = current_stamp()
                if not each((stamp[2], stamp[3], item)):
                    return None
                restore_stamp(stamp)  # ``each`` may have stamped other items
        except Exception as error:  # noqa: BLE001 - surfaced in the main process, in order
            return capture_failure(error, label)
        finally:
            self.feed.load([], stamp_seed)

    def _run_fused(self, outputs: list[Output], count: int) -> list[Output]:
        """The task's outputs, the per-item blocks run as one loop (``RunReader``).

        The recorder, a last ``map``, turns each output into ``(key, draws, item)``
        while its stamp is current; an output that is not ready is waited for.
        """
        assert self._recorder is not None
        runs = RunReader(self._recorder)
        waiting = self._recorder_reader
        while True:
            try:
                runs.extend(outputs, max(count, 1))
            except StopIteration:
                return outputs
            except NotAvailable:
                try:
                    outputs.append(waiting.next())
                except StopIteration:
                    return outputs


def _with_stamp(item: Any) -> Output:
    """``(key, draws, item)`` of an item worker's output, from the current stamp."""
    stamp = current_stamp()
    return (stamp[2], stamp[3], item)
