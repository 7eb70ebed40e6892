"""The compat pipeline's source block: the epoch's plan entries, wherever it runs.

:class:`PlanSource` reads the :class:`~._plan.PlanBoard` at the start of each
epoch (in the calling thread, in worker threads, or in worker processes through
the board's shared-memory copy) and yields its shard's entries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..datapipes import IterDataPipe, StateFields
from ..datapipes.runtime import current_stamp, restore_stamp
from ..events import ReadinessSource
from ._catch_up import CatchUp
from ._plan import PlanBoard
from ._shared_area import SharedArea

__all__ = ["PlanSource"]


class PlanSource(IterDataPipe):
    """Yield the current epoch's plan entries: the sampler's indices or index lists.

    It is the sharding point: shard ``index`` of ``total`` yields the entries
    whose position ``p`` has ``(p // group_size) % total == index``, stamped
    with ``p``, so the workers' merge restores the sampler's order.

    ``fetch``: what the pipeline does with an entry (its ``Fetch``); a worker
    calls it for the entries of an abandoned epoch that torch's worker would
    still have fetched (the plan's ``catch_up``) before it starts the next one.

    Example:
        >>> from pipeloom.compat._plan import EpochPlan, PlanEntries
        >>> board = PlanBoard()
        >>> board.publish(EpochPlan(PlanEntries.from_outputs([5, 3, 9]), base_seed=0))
        >>> list(PlanSource(board))
        [5, 3, 9]
    """

    def __init__(
        self,
        board: PlanBoard,
        *,
        flatten: bool = False,
        fetch: Callable[[Any], Any] | None = None,
    ) -> None:
        self.board = board
        self.fetch = fetch
        self.flatten_entries = flatten  # not "flatten": that is a chaining method
        self.total = 1
        self.index = 0
        self.group_size = 1
        self._entries: Any = None  # PlanEntries, or a live plan's (see _live)
        self._live = False
        self._first = 0  # the epoch position of the plan's first entry
        self._next = 0  # the epoch position of the next entry
        self._skip: frozenset[int] = frozenset()  # positions the plan leaves out
        self._ran: int | None = None  # the serial of the plan this copy ran last

    def attach(self, area: SharedArea | None, wake_fd: int | None = None) -> None:
        """In a new worker process: read plans from the shared ``area``."""
        self.board.attach(area, wake_fd)
        self._ran = None  # it ran nothing yet (under fork it is the parent's object)

    def is_shardable(self) -> bool:
        return True

    def sharding_settings(self, total: int, index: int) -> None:
        self.total, self.index = total, index

    def set_shard_group_size(self, group_size: int) -> None:
        self.group_size = group_size

    def resume_at(self, position: int) -> None:
        self._next = self._first_from(position)

    def reset(self) -> None:
        serial, catch_up = self.board.catch_up()
        if catch_up is not None and catch_up.after == self._ran and serial != self._ran:
            self._catch_up(catch_up)
        self._ran = serial
        self._entries = None
        self._next = 0  # made this shard's first, from the plan's first entry on, in _load()

    def _catch_up(self, catch_up: CatchUp) -> None:
        """Fetch this shard's entries of the abandoned epoch not fetched yet; drop the results."""
        fetch = self.fetch
        if fetch is None:
            return
        stamp = current_stamp()
        try:
            for position, entry in catch_up.entries:
                if position >= self._next and self._first_from(position) == position:
                    self._stamp_item(position)
                    try:
                        fetch(entry)
                    except Exception:  # torch's worker sends it, and its _reset drops it
                        continue
        finally:
            restore_stamp(stamp)

    def _first_from(self, position: int) -> int:
        if self.total == 1:
            return position
        group = position // self.group_size
        ahead = (self.index - group % self.total) % self.total
        return position if ahead == 0 else (group + ahead) * self.group_size

    def _load(self) -> Any:
        plan = self.board.read()
        entries = plan.entries.flattened() if self.flatten_entries else plan.entries
        self._first = plan.first_index if self.flatten_entries else plan.first
        # positions of batches; a loader that fetches item by item refuses such a state
        assert not (plan.skip and self.flatten_entries), "skip needs batch entries"
        self._skip = plan.skip
        self._next = self._first_from(max(self._next, self._first))
        self._entries = entries
        self._live = getattr(entries, "is_live", False)
        return entries

    def async_next(self) -> Any:
        entries = self._entries if self._entries is not None else self._load()
        position = self._next
        while position in self._skip:
            position = self._first_from(position + 1)
        if self._live:  # drawn as the epoch goes: may not be drawn yet (NotAvailable)
            entry = entries.take(position - self._first)
        elif position - self._first >= len(entries):
            raise StopIteration
        else:
            entry = entries[position - self._first]
        self._next = self._first_from(position + 1)
        self._stamp_item(position)
        return entry

    def readiness_sources(self) -> Sequence[ReadinessSource]:
        return (self.board.readiness(),)

    def __len__(self) -> int:
        entries = self._entries if self._entries is not None else self._load()
        if getattr(entries, "is_live", False):
            raise TypeError("the sampler is drawn as the epoch goes: its length is not known")
        return len(entries)

    def state_dict(self) -> dict[str, Any]:
        return {"next": self._next}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._next = StateFields(self, state).int("next")

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_entries"] = None
        state["_live"] = False
        return state

    def __repr__(self) -> str:
        shard = f", shard={self.index}/{self.total}" if self.total > 1 else ""
        return f"PlanSource(flatten={self.flatten_entries}{shard})"
