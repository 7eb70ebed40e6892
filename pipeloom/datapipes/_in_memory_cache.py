"""``in_memory_cache``: keep an epoch's items in memory and replay them in later epochs."""

from __future__ import annotations

import bisect
from collections import deque
from typing import Any

from .._validate import check_bool
from ..errors import NotAvailable
from ._base import IterDataPipe
from ._context import current_stamp, key_position, restore_stamp, thread_draws, worker_info
from ._fingerprint import random_blocks
from ._item_memory import BufferLedger, ItemMemory, item_memory, item_nbytes
from ._pipeline import drawn_epoch_seeds, replay_pipeline_epoch, upstream_blocks
from ._positions import authority_index
from ._stamp_owners import UNKNOWN, StampOwners, StampTally

__all__ = ["InMemoryCacheHolder", "item_nbytes"]

_MIB = 1 << 20


class InMemoryCacheHolder(IterDataPipe):
    """Keep the first epoch's items in memory, replay them after (functional: ``in_memory_cache``).

    The first pass over the stream passes every item on and keeps it. When
    the items outgrow ``size`` MiB (measured: arrays, tensors and bytes count
    their data), the *oldest* are dropped, so the cache holds the last items
    of the stream that fit. Later passes read the items before the cached
    ones from the upstream again (only those: the upstream is left as soon as
    the cached part begins) and replay the rest from memory, with the stamps
    they would have had, so ``item_rng()`` downstream draws as without the cache.

    Where it runs: in the calling process the whole stream is cached and a
    later epoch does no upstream work at all. Under a reading service it runs
    where its input is produced: after the sharding point, in each worker,
    which caches its own shard (``persistent_workers=True`` keeps worker
    processes, and their caches, between epochs; worker threads always do);
    before the sharding point, every worker caches the whole stream. A worker
    makes its first item of each epoch live to learn where its stream starts
    (this is what keeps a resumed epoch right); one that cached nothing, which
    cannot tell an empty shard from one resumed at its end, fills again in the
    next epoch (as does a pass in the calling process resumed from a state that
    counted no item here, which cached nothing). With ``allow_random=True`` over
    a random upstream (or items that
    drew from ``item_rng()`` upstream), a later pass in the calling process that
    must read items of the upstream again (the ones before the cached part, or
    after a resume) restarts the upstream as it ran in the epoch the cache was
    filled in, with that epoch's seeds, so those items are the ones the cache
    is missing rather than another epoch's; ``item_rng()`` downstream draws
    for the current epoch. In workers, over a random order upstream, the cache
    steps aside after its first pass and every epoch reads its upstream live:
    a worker resumed mid-epoch could not tell which epoch's order its cache
    should hold. In the item workers of the
    ``economic`` and ``chunked`` strategies items move between workers, so the
    cache steps aside there.

    Args:
        source: the stream to cache.
        size: the most MiB to hold; None for no limit.
        allow_random: accept random blocks upstream (shuffle, ...), whose
            first epoch's order the cache then replays.

    Raises:
        ValueError: a bad ``size``, or a random block upstream without
            ``allow_random=True``.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> calls = []
        >>> pipe = IterableWrapper(range(4)).map(lambda x: calls.append(x) or x * 10)
        >>> cached = pipe.in_memory_cache()
        >>> list(cached), list(cached), calls
        ([0, 10, 20, 30], [0, 10, 20, 30], [0, 1, 2, 3])
    """

    inputs = ("source",)
    per_item = True
    one_to_one = True
    per_rank_fields = ("size",)
    restart_reason = "to read again, in a later epoch, the random items it does not hold"

    def __init__(
        self, source: IterDataPipe, size: int | float | None = None, *, allow_random: bool = False
    ) -> None:
        if size is not None and (
            isinstance(size, bool) or not isinstance(size, (int, float)) or not size > 0
        ):
            raise ValueError(
                f"size must be a number of MiB > 0, or None for no limit; got {size!r}"
            )
        check_bool("allow_random", allow_random)
        randoms = random_blocks(source)
        if randoms and not allow_random:
            raise ValueError(
                f"in_memory_cache would replay the randomness of {randoms[0]!r} upstream (an "
                f"order, or the seeds item_rng() draws from) of the first epoch in every "
                f"epoch; move that block after .in_memory_cache(), or pass allow_random=True "
                f"to freeze it on purpose"
            )
        self.source = source
        self.size = size
        self.allow_random = allow_random
        self._random_upstream = bool(randoms)
        self._drew = False  # an item drew from item_rng() upstream
        self._drew_waiting = False  # draws upstream while the next item was not ready
        self._limit = None if size is None else int(size * _MIB)
        self.clear()
        self._resets = 0  # passes since the last set_epoch
        self._disabled = False
        self.reset()

    def clear(self) -> None:
        """Forget the cached items (the next pass fills the cache again)."""
        self._entries: list[tuple[Any, int, Any, int]] = []  # key, draws, item, stamp owner
        self._sizes: deque[ItemMemory] = deque()
        self._ledger = BufferLedger()  # each buffer counted once (views, rows of one tensor)
        self._head = 0  # outputs before the first cached one (dropped, or before a resume)
        self._complete = False
        self._tally = StampTally()  # whose stamps the cached items carry (_stamp_owners.py)
        self._filled_in: tuple[int, int] | None = None  # (epoch, round) of the first pass
        self._fill_seeds: list[int | None] = []  # the upstream's epoch seeds then
        self._resumed_fill: tuple[tuple[int, int], list[int | None]] | None = None

    @property
    def cached_items(self) -> int:
        """How many items the cache holds."""
        return len(self._entries)

    @property
    def cached_bytes(self) -> int:
        """How many bytes the cached items keep alive (each buffer once: ``_item_memory.py``)."""
        return self._ledger.nbytes

    def reset(self) -> None:
        in_worker = worker_info() is not None
        self._resets += 1
        if in_worker and self._resets > 1:
            self._disabled = True  # restarted within an epoch: an item worker's task
        if in_worker and self._random_upstream:
            # a worker resumed mid-epoch cannot tell which epoch's order its cache held
            self._disabled = True
        self._in_worker = in_worker
        if not self._complete:
            self.clear()
        self._phase: str | None = None  # fill, counted, live, cached or pass; chosen at first use
        self._ended = False  # this pass filled up to the end of its stream
        self._loaded = False  # this pass resumed a state (its stream may start mid-epoch)
        self._emitted = 0  # outputs returned this pass
        self._pulled = 0  # outputs taken from the source this pass
        self._skip = 0  # outputs to take and drop first (after a resume)
        self._next_entry = 0
        self._stamp: tuple[int | None, int] | None = None
        self._restamp: tuple[dict[int, int], int] | None = None  # ({owner: seed}, epoch)
        self._owners = StampOwners(self)

    @property
    def _replays(self) -> bool:
        """Whether its items are random upstream: a later read must replay the fill epoch."""
        return self._random_upstream or self._drew

    @property
    def restarts_inputs(self) -> bool:
        """True over a random upstream, which a later pass may restart as the first epoch."""
        return self._random_upstream

    def set_epoch(self, epoch: int) -> None:
        self._resets = 0

    def async_next(self) -> Any:
        item = self._next()
        restamp = self._restamp
        if restamp is not None:  # read as in the fill epoch: stamp as its block would now
            seed, epoch, position, draws = current_stamp()
            now = restamp[0].get(self._owners.owner(seed, epoch))
            if now is not None:
                restore_stamp((now, restamp[1], position, draws))
        return item

    def _next(self) -> Any:
        phase = self._phase
        if phase is None:
            phase = self._phase = self._start_pass()
        if phase == "cached":
            return self._from_memory()
        if phase == "fill":
            return self._fill()
        if phase == "live":
            return self._live()
        if phase == "counted":
            return self._counted()
        return self._pass()

    def _start_pass(self) -> str:
        phase = self._choose()
        identity = (self._epoch_number(), self._round_number())
        resumed, self._resumed_fill = self._resumed_fill, None
        if phase == "fill":
            self._filled_in, self._fill_seeds = resumed or (identity, [])
            if resumed is None or resumed[0] == identity:
                return phase
        elif phase not in ("counted", "live") or not self._replays:
            return phase
        if all(block.restartable for block in upstream_blocks(self.source)):
            self._replay_fill_epoch()
            return phase
        # a stream made once per epoch (by workers) cannot replay the fill epoch: this pass
        # reads it live, and caches it again (from its start when it can)
        self._filled_in, self._fill_seeds = identity, []
        if phase == "fill":
            return phase
        self.clear()
        self._filled_in = identity
        return "fill"

    def _replay_fill_epoch(self) -> None:
        """Restart the upstream as in the fill epoch: a random upstream then gives the items
        this pass must read live (the head, or the rest after a resume) as they were cached."""
        self._restamp = (self._current_seeds(), self._epoch_number())
        assert self._filled_in is not None
        replay_pipeline_epoch(self.source, self._filled_in, self._fill_seeds)
        self._skip, self._pulled = self._emitted, 0

    def _current_seeds(self) -> dict[int, int]:
        """This epoch's seeds of the blocks that may stamp items (before a replay rewinds
        them): the authority, the blocks that stamped cached items, those with a derived seed."""
        blocks = upstream_blocks(self)
        wanted = {owner for *_, owner in self._entries if owner != UNKNOWN}
        index = authority_index(self)
        if index is not None:
            wanted.add(index)
        wanted.update(i for i, block in enumerate(blocks) if i and block._block_seed() is not None)
        return {i: blocks[i].epoch_seed() for i in sorted(wanted)}

    def _choose(self) -> str:
        if self._disabled:
            return "pass"
        if not self._complete:
            return "fill"
        # Read live where no block gives the items' seed back: several blocks stamped them,
        # not all known; or one unknown (a later round of a cycle) whose seed only a live
        # item of this epoch tells, but a replay of the fill epoch tells that epoch's
        if not self._tally.replayable or (self._replays and not self._tally.owned):
            self.clear()
            self._disabled = True
            return "pass"
        positioned = bool(self._entries) and self._entries[0][0] is not None
        if self._in_worker and positioned:
            return "live"  # the worker's first items say where its stream starts
        if self._head or (positioned and not self._tally.owned):
            return "counted" if self._head or not positioned else "live"
        self._stamp = (None, self._epoch_number())  # each item's seed: its stamping block's
        return "cached"

    def _pass(self) -> Any:
        while self._skip:
            self.source.async_next()
            self._pulled += 1
            self._skip -= 1
        item = self.source.async_next()
        self._pulled += 1
        self._emitted += 1
        return item

    # -- the first pass: pass on and keep ------------------------------------------
    def _fill(self) -> Any:
        before = thread_draws()  # draws made upstream, also before a block restamped them
        try:
            item = self._pass()
        except NotAvailable:
            self._drew_waiting = self._drew_waiting or thread_draws() != before
            raise
        except StopIteration:
            # A worker may have started mid-stream (resume_at on its sharding point), and so
            # may a resumed pass after the workers' merge (a state translated from batches
            # built in workers counts nothing here): with nothing cached it cannot tell
            # where its stream starts, so it fills again next pass
            unknown_start = self._in_worker or (self._loaded and not self._head)
            self._complete = bool(self._entries) or not unknown_start
            self._record_seeds()
            self._phase = "pass"
            self._ended = True
            raise
        seed, epoch, position, draws = current_stamp()
        drew = draws > 0 or self._drew_waiting or thread_draws() != before
        self._drew_waiting = False
        self._drew = self._drew or drew
        if drew and not self.allow_random:
            raise RuntimeError(
                f"{self!r}: the item at position {position} drew from item_rng() upstream, so "
                f"the cache would replay its random augmentation; apply it after "
                f".in_memory_cache(), or pass allow_random=True to replay it on purpose"
            )
        owner = self._owners.owner(seed, epoch)
        self._tally.note(owner, seed)
        self._keep(position, draws, item, owner)
        return item

    def _record_seeds(self) -> None:
        """Note the upstream's epoch seeds of the fill epoch (kept where known already)."""
        known = self._fill_seeds
        drawn = drawn_epoch_seeds(self.source)
        # Only a seed drawn from torch's generator needs keeping: one derived from the
        # pipeline seed comes again from the epoch and round a replay enters (a block
        # under a cycle has one per round: keeping the last would replay every round
        # with it).
        derived = [block._block_seed() is not None for block in upstream_blocks(self.source)]
        self._fill_seeds = [
            known[i] if i < len(known) and known[i] is not None else None if derived[i] else seed
            for i, seed in enumerate(drawn)
        ]

    def _keep(self, position: Any, draws: int, item: Any, owner: int) -> None:
        memory = item_memory(item)
        entries = self._entries
        entries.append((position, draws, item, owner))
        self._sizes.append(memory)
        ledger = self._ledger
        ledger.add(memory)
        limit = self._limit
        if limit is None or ledger.nbytes <= limit:
            return
        drop = 0
        while ledger.nbytes > limit and drop < len(entries):
            ledger.remove(self._sizes.popleft())
            drop += 1
        while (
            0 < drop < len(entries)
            and position is not None
            and entries[drop][0] == entries[drop - 1][0]
        ):
            ledger.remove(self._sizes.popleft())  # keep whole positions
            drop += 1
        del entries[:drop]
        self._head += drop

    # -- later passes: the head live, then memory --------------------------------------
    def _counted(self) -> Any:
        """The whole stream: its first ``head`` items live, then the cached ones."""
        if self._pulled < self._head:
            item = self._pass()
            seed, epoch, _, _ = current_stamp()
            self._stamp = (seed, epoch)
            return item
        self._phase = "cached"
        return self._from_memory()

    def _live(self) -> Any:
        """Items live until one at a cached position comes; from there on, memory."""
        item = self._pass()
        entries = self._entries
        seed, epoch, key, _ = current_stamp()
        position, first = key_position(key), key_position(entries[0][0])
        if position is None or first is None or position < first:
            return item
        keys: list[int] = [
            -1 if entry[0] is None else key_position(entry[0])  # type: ignore[misc]
            for entry in entries
        ]
        index = bisect.bisect_left(keys, position)
        if index == len(keys) or keys[index] != position:
            self.clear()  # the upstream no longer matches: read live, refill next pass
            self._phase = "pass"
            return item
        self._phase, self._stamp, self._next_entry = "cached", (seed, epoch), index
        self._emitted -= 1  # the cached twin (all of this position's items) comes instead
        return self._from_memory()

    def _from_memory(self) -> Any:
        entries = self._entries
        if self._next_entry >= len(entries):
            raise StopIteration
        position, draws, item, owner = entries[self._next_entry]
        self._next_entry += 1
        stamp = self._stamp
        if stamp is not None:
            seed = stamp[0] if owner == UNKNOWN else self._owners.seed_now(owner)
            restore_stamp((seed, stamp[1], position, draws))
        self._emitted += 1
        return item

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"emitted": self._emitted, "pulled": self._pulled}
        if self._ended:  # a block downstream may have read ahead to the end (threadpool_map)
            state["ended"] = True
        if self._replays and self._filled_in is not None:
            if self._phase == "fill":
                self._record_seeds()
            state["filled_in"] = list(self._filled_in)
            state["fill_seeds"] = list(self._fill_seeds)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume a pass: it reads the upstream from where it was; a warm cache stays for later.

        Over a random upstream the cache is filled again from there, reading the upstream
        as in the epoch it was first filled in (its order, not this epoch's).
        """
        self._emitted, self._pulled = int(state["emitted"]), int(state["pulled"])
        self._skip = max(0, self._emitted - self._pulled)
        self._loaded = True
        self._ended = bool(state.get("ended"))  # kept by a state saved before the next item
        if "filled_in" in state:
            self._complete = False
            epoch, round_number = state["filled_in"]
            self._resumed_fill = ((int(epoch), int(round_number)), list(state["fill_seeds"]))
            self._drew = True  # only a cache that replays saves where it filled
        if self._complete:
            self._phase = "pass"
        else:  # cold: cache from here on; the items before it come live in later passes
            resumed = self._resumed_fill
            self.clear()
            self._resumed_fill = resumed
            self._head = self._emitted
            if state.get("ended") and worker_info() is None:
                # the saved pass had read its stream to the end, and the block that read
                # ahead (threadpool_map) will not ask again: complete, as that pass was
                self._complete, self._phase = True, "pass"
                if resumed is not None:
                    (self._filled_in, self._fill_seeds), self._resumed_fill = resumed, None
                return
            # chosen at first use, as a pass starts: a fill notes the epoch it fills in,
            # which a later pass over a random upstream replays (also when this state
            # was saved before the cache's first item, with no fill epoch of its own)
            self._phase = None

    def __repr__(self) -> str:
        size = "None" if self.size is None else f"{self.size} MiB"
        return f"InMemoryCacheHolder(size={size}, cached_items={len(self._entries)})"
