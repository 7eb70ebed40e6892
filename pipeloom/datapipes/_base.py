"""The block protocol: ``IterDataPipe``, ``MapDataPipe`` and what they share.

A block is a node of the pipeline graph. It names its inputs in the class
attribute ``inputs`` (attribute names holding upstream blocks), and implements
either the non-blocking protocol (``async_next`` / ``async_get``) or the simple
one (a plain ``__iter__`` generator / ``__getitem__``). The base class adapts
each to the other, so both kinds mix in one pipeline.

A class that declares no ``inputs`` has its block-valued attributes taken as
inputs (:meth:`DataPipe.input_names`). Framework state (seeds, epoch, lazy
init) lives in ``_pl_*`` attributes only this module touches; the traits and
hooks a block overrides, with their defaults, are in ``_hooks.py``. The only thing
the base adds to a subclass's methods: with ``lazy_init`` defined, its
``__iter__``, ``__len__``, ``__getitem__``, ``async_next`` and ``async_get``
first make sure ``lazy_init`` ran (once).

Example:
    >>> from pipeloom.datapipes import IterDataPipe
    >>> class Squares(IterDataPipe):
    ...     inputs = ("source",)
    ...     def __init__(self, source):
    ...         self.source = source
    ...     def __iter__(self):
    ...         for x in self.source:
    ...             yield x * x
    >>> from pipeloom.datapipes import IterableWrapper
    >>> list(Squares(IterableWrapper(range(4))))
    [0, 1, 4, 9]
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, TypeVar

import torch

from .._validate import check_int
from ..errors import NotAvailable
from ._attributes import attribute_values, blocks_in, declared_input
from ._context import _ITEM, derive_seed
from ._functional import IterFunctional, MapFunctional
from ._generator_place import GeneratorRun, route_iter
from ._hooks import BlockHooks
from ._nesting import NESTING
from ._numbering import Numbering, install_index_stamps, install_numbering, stamp_position
from ._numbering import overrides as _overrides
from ._reader import BlockingIterator, BlockingReader
from ._rewire import replace_input
from ._stamp_check import check_stamped

__all__ = ["DataPipe", "IterDataPipe", "MapDataPipe"]

T_co = TypeVar("T_co", covariant=True)

_GUARDED = ("__iter__", "__len__", "__getitem__", "async_next", "async_get")

_FRAMEWORK_MODULES = frozenset({__name__, IterFunctional.__module__, "builtins"})  # not blocks


def _guard_lazy_init(method):
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        if not self._pl_initialized:
            self._pl_ensure_init()
        return method(self, *args, **kwargs)

    guarded._pl_guarded = True  # type: ignore[attr-defined]
    return guarded


class DataPipe(BlockHooks):
    """What iterable and map-style blocks share: graph, seeds, framework state.

    Subclasses set ``inputs`` to the names of the attributes that hold their
    upstream blocks (an attribute may hold one block or a sequence of blocks).
    """

    inputs: ClassVar[tuple[str, ...]] = ()

    # Framework-owned per-instance state, kept out of __init__ so subclasses
    # need not call super().__init__(). Only this module reads or writes it.
    _pl_declares_inputs: ClassVar[bool] = False
    _pl_initialized: bool = False
    _pl_seed: int | None = None
    _pl_seed_fixed: bool = False
    _pl_seed_key: int | None = None
    _pl_epoch: int = 0
    _pl_round: int = 0  # repetitions of the stream within an epoch (cycle)
    _pl_epoch_seed: int | None = None
    _pl_numbers_outputs: ClassVar[bool] = False  # see _numbering.py
    _pl_numbering: Numbering | None = None
    _pl_shard: tuple[int, int] = (1, 0)  # (total, index) a reading service gave it

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(cls.__dict__.get("inputs", ()), tuple):
            raise TypeError(
                f"{cls.__name__}.inputs must be a tuple of attribute names, got "
                f"{cls.__dict__['inputs']!r}; write e.g. inputs = ('source',)"
            )
        cls._pl_declares_inputs = any(
            "inputs" in klass.__dict__
            for klass in cls.__mro__
            if klass.__module__ not in _FRAMEWORK_MODULES
        )
        if cls.lazy_init is not DataPipe.lazy_init:
            for name in _GUARDED:
                method = cls.__dict__.get(name)
                if callable(method) and not getattr(method, "_pl_guarded", False):
                    setattr(cls, name, _guard_lazy_init(method))

    # -- graph ---------------------------------------------------------------
    @property
    def parents(self) -> tuple[DataPipe, ...]:
        """The upstream blocks, in the order of :meth:`input_names`."""
        found: list[DataPipe] = []
        if type(self)._pl_declares_inputs:
            for name in self.inputs:
                found.extend(_blocks_in(declared_input(self, name)))
        else:  # read the values, not vars(self): see _attributes.py
            for value in attribute_values(self):
                found.extend(_blocks_in(value))
        return tuple(found)

    def input_names(self) -> tuple[str, ...]:
        """The attributes holding this block's inputs: ``inputs`` when the class declares it
        (even ``()``); else, as for a torchdata block, every attribute holding a block, or a
        list, tuple or dict whose first element is one (a one-level look at walk time)."""
        if type(self)._pl_declares_inputs:
            return self.inputs
        return tuple(name for name, value in vars(self).items() if _blocks_in(value))

    def replace_parent(self, old: DataPipe, new: DataPipe) -> None:
        """Swap the upstream block ``old`` for ``new`` (used by ``pipeloom.graph``)."""
        replace_input(self, old, new)

    @classmethod
    def declares_inputs(cls) -> bool:
        """True when the class (not the framework) sets ``inputs``, even to ``()``."""
        return cls._pl_declares_inputs

    # -- a hook that needs the framework's state (more: _hooks.py) -------------
    def resume_at(self, position: int) -> None:
        """Skip, without producing them, the positions before ``position`` this epoch.

        Called on a sharding point after ``reset()`` to resume an epoch mid-way.
        """
        if type(self)._pl_numbers_outputs:  # numbered by the framework: replays (_numbering.py)
            self._numbering().skip_before = position
            return
        raise NotImplementedError(
            f"{type(self).__name__} is a sharding point but cannot fast-forward to a "
            f"position, so an epoch read through workers cannot resume mid-way; implement "
            f"resume_at(position) on {type(self).__name__}"
        )

    def _restore_numbering(self, count: int, *, replays: bool) -> None:
        self._numbering().resume(count, replays=replays)  # see Numbering.resume

    # -- seeds -----------------------------------------------------------------
    def epoch_seed(self) -> int:
        """The seed for this block's randomness in the current epoch.

        Derived from the pipeline seed (``seed_pipeline``/``DataLoader(seed=)``)
        or the block's own ``seed=`` argument, and the epoch. Without any seed
        it is drawn once per epoch from torch's default generator, so
        ``torch.manual_seed`` makes it reproducible.
        """
        if self._pl_epoch_seed is None:
            if self._pl_seed is None:
                drawn = int(torch.empty((), dtype=torch.int64).random_().item())
                self._pl_epoch_seed = drawn
            elif self._pl_round:
                self._pl_epoch_seed = derive_seed(self._pl_seed, self._pl_epoch, self._pl_round)
            else:
                self._pl_epoch_seed = derive_seed(self._pl_seed, self._pl_epoch)
        return self._pl_epoch_seed

    def use_own_seed(self, seed: int | None) -> None:
        """Give this block its own seed (its ``seed=`` argument; None: the pipeline's)."""
        if check_int("seed", seed, allow_none=True) is None:
            return
        self._pl_seed = seed
        self._pl_seed_fixed = True

    stamp_position = stamp_position  # public: see _numbering.py

    def _key_next_item(self, position: int) -> None:
        """Key the item about to be made at ``position``: the user's code that makes it (a
        ``Dataset.__getitem__``, a generator) may draw ``item_rng()``. Stamp watchers are
        not told: the block stamps the item again once it exists (:meth:`_stamp_item`)."""
        seed = self._pl_epoch_seed
        _ITEM.stamp = (self.epoch_seed() if seed is None else seed, self._pl_epoch, position, 0)

    def _stamp_item(self, position: int) -> None:
        """Mark the current item as this block's output at ``position`` (sources, sharding)."""
        seed = self._pl_epoch_seed
        if seed is None:
            seed = self.epoch_seed()
        item = _ITEM  # stamp_item(), inlined: this runs once per item
        keyed = item.stamp  # the user's code that made it (keyed: _key_next_item) may have
        # drawn: the next draw continues after those, or a map's first draw would repeat them
        draws = keyed[3] if keyed[3] and keyed[2] == position and keyed[0] == seed else 0
        item.stamp = (seed, self._pl_epoch, position, draws)
        if item.watchers:
            for watcher in item.watchers:
                watcher(seed, position)

    # -- framework internals: called by _pipeline and the runtime seam ----------
    def _block_seed(self) -> int | None:  # None: no pipeline seed
        return self._pl_seed

    def _seed_place(self) -> int | None:
        """The block's place in the graph when the pipeline was first seeded (the same in
        every copy of it: a worker's, a process's); None before any seeding."""
        return self._pl_seed_key

    def _assign_seed(self, key: int, pipeline_seed: int | None) -> None:
        """Seed from ``pipeline_seed`` and ``key``, the place in the pipeline first seeded
        (so a worker's copy of a part, re-seeded later, gets the same seeds)."""
        if self._pl_seed_key is None:
            self._pl_seed_key = key
        if not self._pl_seed_fixed:
            seed = None if pipeline_seed is None else derive_seed(pipeline_seed, self._pl_seed_key)
            self._pl_seed = seed
        self._pl_epoch_seed = None

    def _enter_epoch(self, epoch: int) -> None:
        self._pl_epoch = epoch
        self._pl_round = 0
        self._pl_epoch_seed = None
        self.set_epoch(epoch)

    def _enter_round(self, round_number: int) -> None:
        if round_number and not self.restartable:
            raise RuntimeError(
                f"{self!r} reads a stream produced once per epoch (by the workers or a "
                f"separate process), but a block after it restarts it mid-epoch (round "
                f"{round_number}): a cycle(), or a mux(stop='cycle') whose source ran out "
                f"before the others; repeat the stream where it is produced (e.g. "
                f"a.mux(b, stop='cycle').sharding_filter()), use mux(stop='all'), or read "
                f"this pipeline in-process (num_workers=0)"
            )
        self._pl_round = round_number
        self._pl_epoch_seed = None

    def _epoch_number(self) -> int:
        return self._pl_epoch

    def _round_number(self) -> int:  # repetitions of the stream within an epoch (cycle)
        return self._pl_round

    def _drawn_epoch_seed(self) -> int | None:  # without drawing one
        return self._pl_epoch_seed

    def _note_shard(self, total: int, index: int) -> None:
        """A reading service gave this sharding point shard ``index`` of ``total``."""
        self._pl_shard = (total, index)

    def _noted_shard(self) -> tuple[int, int]:
        """The shard a reading service gave this block: ``(1, 0)`` (all) unless sharded."""
        return self._pl_shard

    def _forget_lazy_init(self) -> None:
        """This object now lives in a new process (forked): ``lazy_init`` runs again there."""
        self._pl_initialized = False

    def _pl_ensure_init(self) -> None:
        if self._pl_initialized:
            return
        self._pl_initialized = True
        try:
            self.lazy_init()
        except BaseException:
            self._pl_initialized = False
            raise

    def _restart(self, epoch_seed: int | None = None) -> None:
        """Reset framework state, then the block's own (``reset`` hook); ``epoch_seed``: a
        seed this epoch drew before (replayed), None to derive or draw it again."""
        self._pl_ensure_init()
        self._pl_epoch_seed = epoch_seed
        if self._pl_numbering is not None:
            self._pl_numbering.restart()
        self.reset()

    def _numbering(self) -> Numbering:
        """How the framework numbers this user-defined block's outputs (``stamps_positions``)."""
        numbering = self._pl_numbering
        if numbering is None:
            numbering = self._pl_numbering = Numbering()
        return numbering

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_pl_initialized", None)  # lazy_init runs again where the copy runs
        state.pop("_pl_gen", None)
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class IterDataPipe(IterFunctional, DataPipe):
    """A block that yields items in order.

    Implement either ``async_next`` (non-blocking: return an item, raise
    ``NotAvailable`` when none is ready, ``StopIteration`` at the end, and
    ``reset`` to start over) or a plain ``__iter__`` generator.
    """

    _pl_gen: GeneratorRun | None = None
    _pl_outputs_without_pull: ClassVar[bool] = False  # see _generator_place.py
    _pl_sync_style: ClassVar[bool] = False
    _pl_iter_token: int = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        has_async = _overrides(cls, "async_next", IterDataPipe)
        has_sync = _overrides(cls, "__iter__", IterDataPipe)
        cls._pl_sync_style = has_sync and not has_async
        if cls._pl_sync_style:  # a nested iter() reads it through async_next
            route_iter(cls, IterDataPipe.__iter__)
        cls._pl_numbers_outputs = install_numbering(cls)  # user-defined: see _numbering.py

    def async_next(self) -> Any:
        """Return the next item, or raise ``NotAvailable`` / ``StopIteration``.

        This default drives the block's own ``__iter__`` generator.
        """
        gen = self._pl_gen
        if gen is None:
            if not type(self)._pl_sync_style:
                raise TypeError(
                    f"{type(self).__name__} defines neither async_next() nor __iter__(); "
                    f"implement one of them"
                )
            gen = self._pl_gen = GeneratorRun(self)
        item = gen.next_output()
        if gen.made_without_pull:  # see _generator_place.py
            if type(self).stamps_positions:  # it should have stamped it: _stamp_check.py
                check_stamped(self)
            type(self)._pl_outputs_without_pull = True
        return item

    def _stopped_in_generator(self) -> bool:
        """True when its generator is part-way through an epoch and once yielded without a pull."""
        return self._pl_gen is not None and type(self)._pl_outputs_without_pull

    def async_next_many(self, limit: int) -> list[Any]:
        """Between 1 and ``limit`` next items, for consumers that take many at once.

        Raises ``NotAvailable`` / ``StopIteration`` only when no item at all is
        ready; the thread's item stamp afterwards is unspecified. This default
        calls ``async_next``; sources override it with a faster slice.
        """
        pull = self.async_next
        items = [pull()]
        try:
            while len(items) < limit:
                items.append(pull())
        except (NotAvailable, StopIteration):
            pass
        return items

    def __iter__(self) -> Iterator[Any]:
        """Iterate synchronously; at top level this restarts the pipeline.

        Inside a running pipeline (a block's ``__iter__`` reading its source)
        ``iter()`` does not restart anything: the top-level call restarted
        every block upstream already, through the graph.
        """
        if NESTING.depth == 0:
            from ._pipeline import start_iteration

            start_iteration(self)
        return BlockingIterator(self)

    def __len__(self) -> int:
        raise TypeError(
            f"{type(self).__name__} has no length: its number of items is only known "
            f"by iterating it"
        )

    def _restart(self, epoch_seed: int | None = None) -> None:
        self._pl_gen = None
        self._pl_iter_token += 1
        super()._restart(epoch_seed)

    def _iteration(self) -> int:
        """Which restart the block is in (an iterator of an earlier one is stale)."""
        return self._pl_iter_token


class MapDataPipe(MapFunctional, DataPipe):
    """A block with random access by index.

    Implement either ``async_get(index)`` (non-blocking: return the item or
    raise ``NotAvailable``; a call that raises has *requested* the item) or a
    plain ``__getitem__``; and ``__len__``.
    """

    _pl_sync_style: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        has_async = _overrides(cls, "async_get", MapDataPipe)
        cls._pl_sync_style = _overrides(cls, "__getitem__", MapDataPipe) and not has_async
        install_index_stamps(cls)  # user-defined: see _numbering.py

    def async_get(self, index: int) -> Any:
        """Return item ``index`` or raise ``NotAvailable`` (the item is then requested)."""
        if not type(self)._pl_sync_style:
            raise TypeError(
                f"{type(self).__name__} defines neither async_get() nor __getitem__(); "
                f"implement one of them"
            )
        return type(self).__getitem__(self, index)

    def async_get_many(self, indices: Sequence[int]) -> list[Any]:
        """Items at ``indices`` (all requested; ``NotAvailable`` if any is not ready)."""
        get = self.async_get
        return [get(i) for i in indices]

    def __getitem__(self, index: int) -> Any:
        try:
            return self.async_get(index)
        except NotAvailable:
            return BlockingReader(self).get(index)

    def __len__(self) -> int:
        raise TypeError(f"{type(self).__name__} does not define __len__()")

    def __iter__(self) -> Iterator[Any]:
        for index in range(len(self)):
            yield self[index]


def _blocks_in(value: Any) -> list[DataPipe]:
    return blocks_in(value, DataPipe)
