"""An epoch's sampler output, drawn once in the main process, and where workers read it.

torch's ``DataLoader`` iterates its sampler in the main process and sends
indices to the workers. The compat loader does the same: at ``iter()`` it
draws the epoch's whole sampler output into an :class:`EpochPlan` and
*publishes* it on a :class:`PlanBoard`. The pipeline's source block
(``_plan_source.PlanSource``) reads the board at the start of each epoch, wherever
the reading service runs it: in the calling thread, in worker threads (the
same object), or in worker processes (a shared-memory copy, so persistent
workers see each new epoch without being restarted).
"""

from __future__ import annotations

import os
import pickle
import struct
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import torch

from ..datapipes.runtime import derive_seed
from ..events import FdReadiness, ReadinessSource, Signal
from ._catch_up import CatchUp
from ._live_ring import LiveRing, RingEntries, ring_bytes, ring_geometry
from ._shared_area import SharedArea

__all__ = ["Entries", "EpochPlan", "PlanBoard", "PlanEntries"]

_HEADER = struct.Struct("<qq")  # the sizes of the plan's numbers and of its entries
# What a worker reads of a plan besides its entries.
_NUMBERS = ("base_seed", "first", "first_index", "epoch", "skip", "serial", "catch_up")


class Entries(Protocol):
    """What a plan's entries offer: :class:`PlanEntries`, ``RangeEntries``, ``LiveEntries``."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> Any: ...
    def tail(self, start: int) -> Entries: ...
    def indices_before(self, start: int) -> int: ...
    def flattened(self) -> Any: ...
    def to_state(self) -> dict[str, Any]: ...


class PlanEntries(Sequence[Any]):
    """The sampler's outputs for one epoch, compact when they are ints.

    An entry is one index (``batch_size=None``) or one batch of indices.
    Python ints (and lists of them) are kept in an int64 array and handed out
    again as Python ints and lists; anything else (numpy ints, tensors,
    tuples, keys) is kept as is, so the dataset receives exactly what the
    sampler yielded.

    Example:
        >>> entries = PlanEntries.from_outputs([[3, 1], [2]])
        >>> entries[0], entries[1], len(entries)
        ([3, 1], [2], 2)
    """

    def __init__(
        self,
        objects: list[Any] | None = None,
        flat: np.ndarray | None = None,
        offsets: np.ndarray | None = None,
        recipe: Any = None,
        start: int = 0,
    ) -> None:
        self._objects = objects
        self._flat = flat
        self._offsets = offsets
        # How to draw the whole epoch again (an EpochRecipe, for torch's own samplers),
        # and how many of its entries come before these: a checkpoint keeps only that.
        self._recipe = recipe
        self._start = start

    @classmethod
    def from_outputs(cls, outputs: list[Any]) -> PlanEntries:
        """Pack what a sampler (or batch sampler) yielded for one epoch."""
        if all(type(x) is int for x in outputs):
            return cls(flat=_int64(outputs))
        if all(type(b) is list for b in outputs):
            flat = [x for batch in outputs for x in batch]
            if all(type(x) is int for x in flat):
                offsets = np.zeros(len(outputs) + 1, dtype=np.int64)
                np.cumsum([len(b) for b in outputs], out=offsets[1:])
                return cls(flat=_int64(flat), offsets=offsets)
        return cls(objects=list(outputs))

    def __len__(self) -> int:
        if self._objects is not None:
            return len(self._objects)
        assert self._flat is not None
        return len(self._flat) if self._offsets is None else len(self._offsets) - 1

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            raise TypeError("PlanEntries takes one int index; use tail(start) for a suffix")
        if self._objects is not None:
            return self._objects[index]
        assert self._flat is not None
        if self._offsets is None:
            return int(self._flat[index])
        return self._flat[self._offsets[index] : self._offsets[index + 1]].tolist()

    def flattened(self) -> PlanEntries:
        """One entry per index (for a pipeline that batches the indices itself)."""
        if self._objects is not None:
            return PlanEntries(objects=[x for batch in self._objects for x in batch])
        return PlanEntries(flat=self._flat)

    def tail(self, start: int) -> PlanEntries:
        """The entries from ``start`` on (what is left after a checkpoint)."""
        if self._objects is not None:
            return PlanEntries(objects=self._objects[start:])
        assert self._flat is not None
        recipe, after = self._recipe, self._start + start
        if self._offsets is None:
            return PlanEntries(flat=self._flat[start:], recipe=recipe, start=after)
        offsets = self._offsets[start:]
        return PlanEntries(
            flat=self._flat[offsets[0] :], offsets=offsets - offsets[0], recipe=recipe, start=after
        )

    def for_workers(self) -> PlanEntries:
        """What worker processes read (no recipe)."""
        return PlanEntries(self._objects, self._flat, self._offsets)

    def indices_before(self, start: int) -> int:
        """How many indices the entries before ``start`` hold (a batch holds several)."""
        if self._objects is not None:
            return sum(len(b) if isinstance(b, list) else 1 for b in self._objects[:start])
        return start if self._offsets is None else int(self._offsets[start])

    def to_state(self) -> dict[str, Any]:
        """A ``torch.save``-able dict (tensors, not numpy arrays, for ``weights_only``).

        Entries drawn from a recipe keep the recipe and how many entries of
        its epoch come first, not the indices.
        """
        if self._recipe is not None:
            return {"recipe": self._recipe.to_state(), "start": self._start}
        if self._objects is not None:
            return {"objects": list(self._objects)}
        assert self._flat is not None
        state: dict[str, Any] = {"flat": torch.from_numpy(self._flat.copy())}
        if self._offsets is not None:
            state["offsets"] = torch.from_numpy(self._offsets.copy())
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> PlanEntries:
        if "objects" in state:
            return cls(objects=list(state["objects"]))
        offsets = state.get("offsets")
        return cls(
            flat=state["flat"].numpy().astype(np.int64),
            offsets=None if offsets is None else offsets.numpy().astype(np.int64),
        )

    def __repr__(self) -> str:
        return f"PlanEntries({len(self)} entries)"


def _int64(values: list[int]) -> np.ndarray:
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        raise ValueError(
            "the sampler yielded an index outside the int64 range; a dataset index must "
            "fit in 64 bits"
        ) from None


@dataclass(frozen=True)
class EpochPlan:
    """What the main process decided for one epoch.

    The engine runs the plan as its epoch :attr:`engine_epoch`, mixed from
    ``base_seed`` and ``epoch``, and its items keep their positions in the
    whole epoch, so ``item_rng()`` (and economic's per-item seeding of the
    global RNGs) follows torch's seeding rule -- a new base seed per
    iterator, from ``generator`` or torch's global RNG -- and a resumed or
    continued epoch draws what the uninterrupted one would.

    Attributes:
        entries: the sampler's outputs, in order, from entry ``first`` of the epoch on.
        base_seed: torch's ``_base_seed`` for the epoch; worker ``i`` is seeded
            with ``base_seed + i``, as in torch.
        first: how many of the epoch's entries came before ``entries`` (delivered
            before a resume, or before a failed batch and the failed one).
        first_index: how many indices those entries held (positions of a
            pipeline that fetches index by index).
        epoch: how many epochs the loader began before this one.
        skip: positions (from ``first`` on) of entries already delivered or
            failed out of order (``in_order=False``): left out, the others keep
            their positions.
        outputs: an ``IterableDataset``'s outputs delivered per worker (its
            epoch is read again and those are left out).
        serial: set by :meth:`PlanBoard.publish`: which publication this is.
        catch_up: what persistent workers fetch of the abandoned epoch before
            this one (see ``_catch_up``).

    Example:
        >>> plan = EpochPlan(PlanEntries.from_outputs([[4, 1], [0], [3, 2]]), base_seed=7)
        >>> rest = plan.tail(2)
        >>> rest.entries[0], rest.first, rest.first_index
        ([3, 2], 2, 3)
    """

    entries: Entries
    base_seed: int
    first: int = 0
    first_index: int = 0
    epoch: int = 0
    skip: frozenset[int] = frozenset()
    outputs: tuple[int, ...] = ()
    serial: int = 0
    catch_up: CatchUp | None = None

    @property
    def engine_epoch(self) -> int:
        """The epoch number the engine runs this plan as (63 bits)."""
        return derive_seed(self.base_seed, self.epoch)

    def tail(self, start: int) -> EpochPlan:
        """The plan from its entry ``start`` on; positions go on counting from the epoch's start."""
        first = self.first + start
        return EpochPlan(
            self.entries.tail(start),
            self.base_seed,
            first,
            self.first_index + self.entries.indices_before(start),
            self.epoch,
            frozenset(p for p in self.skip if p >= first),
        )

    def without(self, below: int, done: set[int] | frozenset[int]) -> EpochPlan:
        """The plan less the entries at positions under ``below`` and in ``done``.

        For batches delivered out of order: the rest keep their positions.

        >>> plan = EpochPlan(PlanEntries.from_outputs([0, 1, 2, 3]), base_seed=7)
        >>> rest = plan.without(1, {2})
        >>> rest.first, sorted(rest.skip), rest.entries[0]
        (1, [2], 1)
        """
        skip = set(done) | self.skip
        first = max(below, self.first)
        while first in skip:
            first += 1
        return replace(self.tail(first - self.first), skip=frozenset(p for p in skip if p > first))

    def to_state(self, delivered: int, *, iterable: bool) -> dict[str, Any]:
        """The interrupted epoch, for a checkpoint (``delivered`` batches of ``entries`` given)."""
        state: dict[str, Any] = {
            "entries": None if iterable else self.entries.to_state(),
            "base_seed": self.base_seed,
            "delivered": delivered,
            "first": self.first,
            "first_index": self.first_index,
            "plan_epoch": self.epoch,
        }
        if self.skip:
            state["skip"] = sorted(self.skip)
        if self.outputs:
            state["outputs"] = list(self.outputs)
        return state


class PlanBoard:
    """Where the main process publishes each epoch's plan for the blocks that read it.

    Readers in the main process and in worker threads read the published
    object. Readers in worker processes read a shared-memory copy: call
    :meth:`share` before the workers start, and :meth:`attach` in each worker.
    The board travels by reference: ``deepcopy`` returns the board itself and
    pickling drops its contents (a worker attaches the shared area instead).

    Example:
        >>> board = PlanBoard()
        >>> board.publish(EpochPlan(PlanEntries.from_outputs([0, 1]), base_seed=7))
        >>> board.read().base_seed
        7
    """

    def __init__(self) -> None:
        self._plan: EpochPlan | None = None
        self._area: SharedArea | None = None  # shared memory, made by share()
        self._shared = False
        self._attached = False  # True in a worker process: read the area
        self._serial = 0  # plans published so far
        # a live plan (see _live): readers in threads wait on the signal, in worker
        # processes on the eventfd, which the main process writes as it draws
        self._signal = Signal()
        self.wake_fd: int | None = None
        self._ahead = 0
        self._ring: LiveRing | None = None

    def share(self, ahead: int = 0) -> None:
        """Also keep a shared-memory copy of each plan, for worker processes.

        ``ahead``: how many sampler outputs workers are handed ahead of the
        consumer (``prefetch_factor * num_workers``), for a live plan's ring.
        """
        self._shared = True
        self._ahead = ahead
        if self._area is None:
            self._area = SharedArea()
        if self.wake_fd is None and hasattr(os, "eventfd"):  # Linux
            self.wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            weakref.finalize(self, os.close, self.wake_fd)

    @property
    def area(self) -> SharedArea | None:
        """The shared-memory copy (None unless :meth:`share` was called)."""
        return self._area

    def publish(self, plan: EpochPlan) -> None:
        """Make ``plan`` the current one (worker processes read it at their next epoch)."""
        self._serial += 1
        plan = replace(plan, serial=self._serial)
        entries = plan.entries
        live = getattr(entries, "is_live", False)
        if live:
            plan = replace(plan, entries=entries.for_serial(self._serial))  # type: ignore[attr-defined]
            plan.entries.draws.on_draw = self._wake  # type: ignore[attr-defined]
        self._plan, self._ring = plan, None
        if not self._shared:
            return
        fields = {name: getattr(plan, name) for name in _NUMBERS}
        if live and self.wake_fd is None:
            raise RuntimeError(
                "this sampler is drawn as the epoch goes (it has no __len__, or it yields more "
                "than len(sampler)), and waking worker processes for its outputs needs Linux's "
                "eventfd; use worker_type='thread' or num_workers=0 here"
            )
        if live:
            draws = plan.entries.draws  # type: ignore[attr-defined]
            held = [draws.get(p) for p in range(plan.first, min(draws.drawn, plan.first + 8))]
            fields["ring"] = ring_geometry(self._ahead, held)
            payload = pickle.dumps(None, protocol=5)
        else:  # PlanEntries or RangeEntries, without the recipe a checkpoint keeps
            payload = pickle.dumps(entries.for_workers(), protocol=5)  # type: ignore[attr-defined]
        numbers = pickle.dumps(fields, protocol=5)
        needed = _HEADER.size + len(numbers) + len(payload)
        ring_at = -(-needed // 64) * 64
        if live:
            needed = ring_at + ring_bytes(*fields["ring"])
        area = self._area
        assert area is not None
        area.ensure(needed)  # grown in place: running workers map it again as they read
        view = area.view()
        view[: _HEADER.size] = np.frombuffer(_HEADER.pack(len(numbers), len(payload)), np.uint8)
        body = numbers + payload
        view[_HEADER.size : _HEADER.size + len(body)] = np.frombuffer(body, dtype=np.uint8)
        if live:
            self._ring = LiveRing(view[ring_at:], *fields["ring"])
            self._ring.start(self._serial, plan.first)
            self.feed(plan.first)

    def feed(self, low: int) -> None:
        """Hand worker processes the live plan's outputs drawn so far (those that fit).

        ``low``: the first position not delivered yet; the ring holds outputs from there.
        """
        ring, plan = self._ring, self._plan
        if ring is None or plan is None:
            return
        draws = plan.entries.draws  # type: ignore[attr-defined]
        published = ring.published
        last = min(draws.drawn, max(low, plan.first) + ring.slots)
        for position in range(published, last):
            ring.put(position, draws.get(position))
        if draws.end is not None and ring.published == draws.end:
            ring.finish(draws.end)
        if last > published or draws.end is not None:
            self._wake()

    def stop_live(self) -> None:
        """End the current live plan's readers now (its engine epoch is being stopped)."""
        plan = self._plan
        if plan is None or not getattr(plan.entries, "is_live", False):
            return
        if self._ring is not None:
            self._ring.stop()
        plan.entries.draws.stop(plan.serial)  # type: ignore[attr-defined]  # wakes them

    def _wake(self) -> None:
        self._signal.fire()
        if self.wake_fd is not None:
            try:
                os.eventfd_write(self.wake_fd, 1)
            except BlockingIOError:  # the counter is full: readers are awake already
                pass

    def readiness(self) -> ReadinessSource:
        """Where a reader of a live plan waits for the main process to draw more."""
        if self._attached and self.wake_fd is not None:
            return FdReadiness(self.wake_fd)
        return self._signal

    @property
    def serial(self) -> int:
        """The serial of the current plan (0: none published yet)."""
        return self._serial

    def attach(self, area: SharedArea | None, wake_fd: int | None = None) -> None:
        """In a worker process: read plans from the shared ``area`` from now on."""
        self._area = area
        self.wake_fd = wake_fd
        self._attached = True
        self._plan = None

    def read(self) -> EpochPlan:
        """The current plan."""
        if self._attached:
            view, numbers_size, size = self._view()
            start = _HEADER.size + numbers_size
            numbers = self._numbers(view, numbers_size)
            geometry = numbers.pop("ring", None)
            if geometry is not None:  # a live plan: its entries come through the ring
                ring_at = -(-(start + size) // 64) * 64
                ring = LiveRing(view[ring_at:], *geometry)
                live = RingEntries(ring, numbers["first"], numbers["serial"])
                return EpochPlan(live, **numbers)  # type: ignore[arg-type]
            entries = pickle.loads(view[start : start + size].tobytes())
            return EpochPlan(entries, **numbers)
        if self._plan is None:
            raise RuntimeError(
                "the epoch plan was not published or did not reach this process; a compat "
                "pipeline must be run by pipeloom.compat.DataLoader"
            )
        return self._plan

    def catch_up(self) -> tuple[int, CatchUp | None]:
        """The current plan's serial and catch-up, without reading its entries."""
        if not self._attached:  # in the main process: nothing published is none to catch up
            return (0, None) if self._plan is None else (self._plan.serial, self._plan.catch_up)
        numbers = self._numbers(*self._view()[:2])
        return numbers["serial"], numbers["catch_up"]

    def _view(self) -> tuple[np.ndarray, int, int]:
        if self._area is None:
            raise RuntimeError("no epoch plan was published before the workers started")
        self._area.refresh()  # the main process may have grown it
        view = self._area.view()
        numbers_size, size = _HEADER.unpack(view[: _HEADER.size].tobytes())
        return view, numbers_size, size

    @staticmethod
    def _numbers(view: np.ndarray, size: int) -> dict[str, Any]:
        numbers: dict[str, Any] = pickle.loads(view[_HEADER.size : _HEADER.size + size].tobytes())
        return numbers

    def __deepcopy__(self, memo: dict[int, Any]) -> PlanBoard:
        return self

    def __getstate__(self) -> dict[str, Any]:
        return {
            "_plan": None,
            "_area": None,
            "_shared": self._shared,
            "_attached": False,
            "_serial": 0,
            "_signal": Signal(),
            "wake_fd": None,
            "_ahead": self._ahead,
            "_ring": None,
        }

    def __repr__(self) -> str:
        return f"PlanBoard(shared={self._shared})"
