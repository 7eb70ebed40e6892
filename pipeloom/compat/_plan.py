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

import pickle
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from ..datapipes.runtime import derive_seed
from ._catch_up import CatchUp

__all__ = ["EpochPlan", "PlanBoard", "PlanEntries"]

_HEADER = struct.Struct("<qq")  # the sizes of the plan's numbers and of its entries
_MIN_CAPACITY = 64 * 1024
# What a worker reads of a plan besides its entries.
_NUMBERS = ("base_seed", "first", "first_index", "epoch", "skip", "serial", "catch_up")


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

    entries: PlanEntries
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
    pickling drops its contents (a worker attaches the shared buffer instead).

    Example:
        >>> board = PlanBoard()
        >>> _ = board.publish(EpochPlan(PlanEntries.from_outputs([0, 1]), base_seed=7))
        >>> board.read().base_seed
        7
    """

    def __init__(self) -> None:
        self._plan: EpochPlan | None = None
        self._buffer: torch.Tensor | None = None  # shared memory, set by share()
        self._shared = False
        self._attached = False  # True in a worker process: read the buffer
        self._serial = 0  # plans published so far

    def share(self) -> None:
        """Also keep a shared-memory copy of each plan, for worker processes."""
        self._shared = True

    @property
    def buffer(self) -> torch.Tensor | None:
        """The shared-memory copy (None until a plan is published on a shared board)."""
        return self._buffer

    def publish(self, plan: EpochPlan) -> bool:
        """Make ``plan`` the current one; True when the shared buffer was replaced.

        A replaced buffer is invisible to worker processes already running:
        the caller restarts them.
        """
        self._serial += 1
        plan = replace(plan, serial=self._serial)
        self._plan = plan
        if not self._shared:
            return False
        numbers = pickle.dumps({name: getattr(plan, name) for name in _NUMBERS}, protocol=5)
        entries = plan.entries
        payload = pickle.dumps((entries._objects, entries._flat, entries._offsets), protocol=5)
        needed = _HEADER.size + len(numbers) + len(payload)
        replaced = self._buffer is None or self._buffer.numel() < needed
        if replaced:
            capacity = max(_MIN_CAPACITY, 2 * needed)
            self._buffer = torch.empty(capacity, dtype=torch.uint8).share_memory_()
        assert self._buffer is not None
        view = self._buffer.numpy()
        view[: _HEADER.size] = np.frombuffer(_HEADER.pack(len(numbers), len(payload)), np.uint8)
        view[_HEADER.size : needed] = np.frombuffer(numbers + payload, dtype=np.uint8)
        return replaced

    @property
    def serial(self) -> int:
        """The serial of the current plan (0: none published yet)."""
        return self._serial

    def attach(self, buffer: torch.Tensor | None) -> None:
        """In a worker process: read plans from the shared ``buffer`` from now on."""
        self._buffer = buffer
        self._attached = True
        self._plan = None

    def read(self) -> EpochPlan:
        """The current plan."""
        if self._attached:
            view, numbers_size, size = self._view()
            start = _HEADER.size + numbers_size
            entries = pickle.loads(view[start : start + size].tobytes())
            return EpochPlan(PlanEntries(*entries), **self._numbers(view, numbers_size))
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
        if self._buffer is None:
            raise RuntimeError("no epoch plan was published before the workers started")
        view = self._buffer.numpy()
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
            "_buffer": None,
            "_shared": self._shared,
            "_attached": False,
            "_serial": 0,
        }

    def __repr__(self) -> str:
        return f"PlanBoard(shared={self._shared})"
