"""A user's sampler drawn as the epoch goes, with torch's timing.

torch's ``DataLoader`` asks its sampler for an output when it hands a batch to
a worker: ``prefetch_factor * num_workers`` outputs at ``iter()``, then one
more for each batch ``next()`` returns (without workers, one per ``next()``).
The compat loader draws torch's own samplers whole at ``iter()``
(``_sampling``), and a user's sampler whole when it says how long it is and
ends there: ``len(sampler)`` outputs, then ``StopIteration``. Any other
sampler -- one without ``__len__``, or an infinite one such as detectron2's
``TrainingSampler`` or MMEngine's ``InfiniteSampler`` -- is drawn as the
epoch goes: :class:`LiveDraws` holds the outputs drawn so far, the loader
draws more before each ``next()`` (:meth:`LiveDraws.draw_to`), and the
pipeline's source reads them through a :class:`LiveEntries` view: at once in
the thread that draws, by waiting in worker threads, and through the plan
board's shared ring (``_live_ring``) in worker processes.

Such an epoch cannot be checkpointed mid-way: a sampler's iterator cannot say
what it would yield next.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from ..errors import NotAvailable, StateError
from ._plan import PlanEntries

__all__ = ["LiveDraws", "LiveEntries", "draw_user_epoch", "own_copy"]


def draw_user_epoch(
    iterator: Iterator[Any], index_sampler: Any, ahead: int = 0
) -> PlanEntries | LiveEntries:
    """A user's sampler epoch: drawn whole when it is as long as it says, else live.

    A live epoch draws ``ahead`` outputs now, as torch's ``iter()`` hands its workers.

    Example:
        >>> draw_user_epoch(iter([3, 1]), [3, 1])
        PlanEntries(2 entries)
        >>> live = draw_user_epoch(itertools.count(), range(2))   # yields more than len()
        >>> live, live[2]
        (LiveEntries(3 drawn), 2)
    """
    try:
        length = len(index_sampler)
    except (TypeError, ValueError, OverflowError, NotImplementedError):
        length = None  # no __len__: whatever it yields is drawn as the epoch goes
    drawn: list[Any] = []
    if length is not None:
        drawn = [own_copy(x) for x in itertools.islice(iterator, length + 1)]
        if len(drawn) <= length:  # it ran out: the whole epoch, checkpointable
            return PlanEntries.from_outputs(drawn)
    draws = LiveDraws(iterator, drawn, type(index_sampler).__name__)
    draws.draw_to(ahead)  # and the calling thread, the consumer's, may draw on demand
    return LiveEntries(draws)


class LiveDraws:
    """The outputs of one epoch's sampler iterator, drawn so far (absolute positions).

    ``drawn``: how many were drawn; ``end``: how many there are, once the
    iterator ran out. Entries under the oldest one still needed are dropped
    (:meth:`keep_from`), so an endless epoch holds a bounded number.
    """

    def __init__(self, iterator: Iterator[Any], drawn: list[Any], sampler: str) -> None:
        self._iterator = iterator
        self._kept: deque[Any] = deque(drawn)
        self._starts: deque[int] = deque()  # the index position each kept entry starts at
        self._indices = 0
        for entry in drawn:
            self._note(entry)
        self._base = 0  # the position of _kept[0]
        self.drawn = len(drawn)
        self.end: int | None = None
        self.sampler = sampler
        self.stopped: set[int] = set()  # serials of published runs stopped early
        self.on_draw: Callable[[], None] | None = None  # the board's wake-up, for readers
        self._drawer: int | None = None  # the thread that may draw on demand
        self._lock = threading.Lock()  # worker threads read while the drawer appends and drops

    def _note(self, entry: Any) -> None:
        self._starts.append(self._indices)
        self._indices += _size(entry)

    def draw_to(self, count: int) -> None:
        """Draw until ``count`` outputs were drawn or the sampler ran out (the calling
        thread may then draw on demand)."""
        self._drawer = threading.get_ident()
        drawn = self.drawn
        while self.drawn < count and self.end is None:
            try:
                entry = own_copy(next(self._iterator))
            except StopIteration:
                self.end = self.drawn
                break
            with self._lock:
                self._kept.append(entry)
                self._note(entry)
                self.drawn += 1
        if (self.drawn != drawn or self.end is not None) and self.on_draw is not None:
            self.on_draw()

    def keep_from(self, position: int) -> None:
        """Forget the entries before ``position`` (delivered: nothing reads them again)."""
        with self._lock:
            while self._base < position and self._base < self.drawn:
                self._kept.popleft()
                self._starts.popleft()
                self._base += 1

    def get(self, position: int) -> Any:
        """The entry at ``position``; ``IndexError`` if not drawn or forgotten."""
        with self._lock:
            if not self._base <= position < self.drawn:
                raise IndexError(f"sampler output {position} is not held (drawn: {self.drawn})")
            return self._kept[position - self._base]

    def take(self, position: int, serial: int) -> Any:
        """The entry at ``position`` for a reader of run ``serial``, as a block reads it.

        Raises ``StopIteration`` past the end (or when the run was stopped), and
        ``NotAvailable`` when it is not drawn yet -- except in the thread that
        draws, which draws it now.
        """
        if serial in self.stopped:
            raise StopIteration
        if position >= self.drawn and self._drawer == threading.get_ident():
            self.draw_to(position + 1)
        if position < self.drawn:
            return self.get(position)
        if self.end is not None:
            raise StopIteration
        raise NotAvailable

    def index_start(self, position: int) -> int:
        """How many indices the entries before ``position`` hold (drawing up to it)."""
        if position > self.drawn:
            self.draw_to(position)
        with self._lock:
            if position >= self.drawn:
                return self._indices
            if position < self._base:
                raise IndexError(f"sampler output {position} was delivered and forgotten")
            return self._starts[position - self._base]

    def stop(self, serial: int) -> None:
        """Readers of run ``serial`` end now (its engine epoch is being stopped)."""
        self.stopped.add(serial)
        if self.on_draw is not None:
            self.on_draw()


def own_copy(output: Any) -> Any:
    """A sampler's output as it is now: a batch sampler may reuse its list for the next.

    torch hands each output to its fetcher or a worker's index queue (a copy)
    before it asks for the next one, so an output changed afterwards is read
    as it was. Lists, NumPy arrays and tensors are copied, shallowly.

    >>> batch = [1, 2]
    >>> kept = own_copy(batch); batch.clear(); kept
    [1, 2]
    """
    if type(output) is list:
        return list(output)
    if isinstance(output, np.ndarray):
        return output.copy()
    if isinstance(output, torch.Tensor):
        return output.clone()
    return output


def _size(entry: Any) -> int:
    try:
        return len(entry)
    except TypeError:
        return 1


class LiveEntries:
    """A plan's entries from a :class:`LiveDraws`, from position ``start`` on.

    Reads like :class:`~._plan.PlanEntries` for what was drawn (``len()`` is
    the count drawn so far); a block reads with :meth:`take`.
    """

    is_live = True

    def __init__(
        self, draws: LiveDraws, start: int = 0, serial: int = 0, first_index: int | None = None
    ) -> None:
        self.draws = draws
        self.start = start
        self.serial = serial
        # the index position of its first entry, while that entry is still held
        self.first_index = draws.index_start(start) if first_index is None else first_index

    def for_serial(self, serial: int) -> LiveEntries:
        """This view, as published in run ``serial``."""
        return LiveEntries(self.draws, self.start, serial, self.first_index)

    def __len__(self) -> int:
        return self.draws.drawn - self.start

    def __getitem__(self, index: int) -> Any:
        return self.draws.get(self.start + index)

    def take(self, index: int) -> Any:
        return self.draws.take(self.start + index, self.serial)

    def tail(self, start: int) -> LiveEntries:
        return LiveEntries(self.draws, self.start + start)

    def indices_before(self, start: int) -> int:
        return self.draws.index_start(self.start + start) - self.first_index

    def flattened(self) -> FlatLiveEntries:
        return FlatLiveEntries(self)

    def to_state(self) -> dict[str, Any]:
        raise StateError(
            f"this epoch's sampler ({self.draws.sampler}) is drawn as the epoch goes -- it has "
            f"no __len__, or it yielded more outputs than len(sampler) -- so no checkpoint "
            f"can say what it would yield next. Save checkpoints between epochs, or give "
            f"the sampler a __len__ that its epoch keeps to: the loader then draws the "
            f"whole epoch at iter() and can save where it is"
        )

    def __repr__(self) -> str:
        return f"LiveEntries({len(self)} drawn)"


class FlatLiveEntries:
    """One entry per index of a :class:`LiveEntries` (read in order, by one reader)."""

    is_live = True

    def __init__(self, entries: LiveEntries) -> None:
        self._entries = entries
        self._at = 0  # the entry holding the current index
        self._first = 0  # the flat index of its first index

    def take(self, index: int) -> Any:
        entries = self._entries
        while True:
            batch = entries.take(self._at)
            size = _size(batch)
            if index < self._first + size:
                if index < self._first:
                    raise RuntimeError("a live plan is read in order")
                return batch[index - self._first]
            self._first += size
            self._at += 1

    def __len__(self) -> int:
        draws = self._entries.draws
        return draws.index_start(draws.drawn) - self._entries.first_index
