"""Positions for the outputs of user-defined sources and sharding points.

Every item needs a position: ``item_rng()`` draws from it, the workers' merge
orders by it, a checkpoint resumes at it. pipeloom's own sources and sharding
points stamp them. A block defined outside pipeloom that is where positions
originate (a source, or the sharding root: shardable, with no shardable block
upstream) and does not stamp them itself (``stamps_positions = False``, the
default) has its outputs numbered here: output ``k`` of shard ``i`` of ``n``
gets position ``k * n + i``, so shards are merged round-robin by their local
count, and an unsharded block (in-process, or read by the main process under
economic and chunked) numbers ``0, 1, 2, ...``. A resume makes and drops the
outputs before its position.

A map-style source defined outside pipeloom (no map-style input) has item
``index`` stamped with position ``index`` before its ``async_get`` or
``__getitem__`` runs, as ``SequenceWrapper`` stamps its items, so
``item_rng()`` in a ``.map(fn)`` over it draws from the item's index under
every reading service.

A block that knows its positions stamps them itself (pipeloom's own blocks
are never numbered here):

Example:
    >>> from pipeloom.datapipes import IterDataPipe, current_position
    >>> class Tens(IterDataPipe):
    ...     stamps_positions = True
    ...     def __iter__(self):
    ...         for position in range(3):
    ...             self.stamp_position(position)
    ...             yield position * 10
    >>> list(Tens().map(lambda x: (x, current_position())))
    [(0, 0), (10, 1), (20, 2)]
"""

from __future__ import annotations

import functools
from typing import Any

from .._walk import walk_upstream
from ..errors import NotAvailable
from ._context import _ITEM, stamp_output
from ._output_stamps import OutputStamps
from ._stamp_check import stamp_checked

__all__ = [
    "Numbering",
    "install_index_stamps",
    "install_numbering",
    "overrides",
    "stamp_position",
]


def stamp_position(self: Any, position: int, output: int | None = None) -> None:
    """Stamp the item this block is about to return as the item at ``position`` of the
    epoch's stream, or (``output=j``) as the ``j``-th output made from it.

    For a source or sharding point that knows its items' positions (set
    ``stamps_positions = True`` on the class): ``item_rng()`` downstream draws
    from the key (``position`` or ``(position, j)``), the workers' merge orders
    by ``position``, and worker ``i`` of ``n`` must keep the positions ``p`` with
    ``p % n == i``.
    """
    self._stamp_item(position)
    item = _ITEM
    if output is not None:
        stamp_output(item.stamp, output)
    item.positioned = item.stamp  # for a generator's check: _stamp_check.py


class Numbering:
    """A block's numbering this epoch: its shard, outputs numbered, positions to skip."""

    __slots__ = ("active", "count", "key", "outputs", "shard", "skip_before")

    def __init__(self) -> None:
        self.shard = (1, 0)  # (total, index) from sharding_settings
        self.restart()

    def resume(self, count: int, *, replays: bool) -> None:
        """Go on after ``count`` outputs delivered before a checkpoint.

        A block that saved an empty state (``{}``: nothing to find its place
        again from, e.g. a plain ``__iter__`` generator) ``replays``: it starts
        over and drops those outputs. A block that saved a state restored its
        place from it and counts on from ``count``.
        """
        if replays:
            total, index = self.shard
            self.count = 0
            self.skip_before = count * total + index
        else:
            self.count = count

    def restart(self) -> None:
        self.count = 0
        self.key: tuple[int, int] | None = None  # (epoch seed, epoch) of this epoch's keys
        self.active: bool | None = None  # decided at the first output of the epoch
        self.skip_before = 0  # positions before it were delivered before a resume
        # a block between source and output written with async_next: the keys of the
        # several outputs it may make of one input (see _output_stamps.py)
        self.outputs: OutputStamps | None = None


def originates_positions(block: Any) -> bool:
    """True when ``block`` is a source (no iterable input) or the sharding root."""
    from ._base import IterDataPipe

    if not any(isinstance(parent, IterDataPipe) for parent in block.parents):
        return True
    return block.is_shardable() and not any(b.is_shardable() for b in walk_upstream(block)[1:])


def install_numbering(cls: type) -> bool:
    """For a class defined outside pipeloom with ``stamps_positions`` False: wrap its
    ``async_next`` and ``sharding_settings`` (once per method) and return True."""
    if cls.__module__.startswith("pipeloom."):
        return False
    if cls.stamps_positions:  # type: ignore[attr-defined]
        method = cls.__dict__.get("async_next")
        if method is not None and not getattr(method, "stamp_check", None):
            cls.async_next = stamp_checked(method)  # type: ignore[attr-defined]
        return False
    if not getattr(cls.async_next, "numbering_wraps", None):  # type: ignore[attr-defined]
        cls.async_next = _numbered(cls.async_next)  # type: ignore[attr-defined]
    if not getattr(cls.sharding_settings, "numbering_wraps", None):  # type: ignore[attr-defined]
        cls.sharding_settings = _recording_shard(cls.sharding_settings)  # type: ignore[attr-defined]
    return True


def install_index_stamps(cls: type) -> None:
    """For a map-style class defined outside pipeloom with ``stamps_positions`` False:
    wrap its ``async_get`` (once) so a source stamps item ``index`` before reading it."""
    if cls.__module__.startswith("pipeloom.") or cls.stamps_positions:  # type: ignore[attr-defined]
        return
    if not getattr(cls.async_get, "numbering_wraps", None):  # type: ignore[attr-defined]
        cls.async_get = _index_stamped(cls.async_get)  # type: ignore[attr-defined]


def _index_stamped(method: Any) -> Any:
    @functools.wraps(method)
    def async_get(self: Any, index: Any) -> Any:
        numbering = self._numbering()
        if numbering.active is None:  # a source: no map-style input
            numbering.active = not any(hasattr(p, "async_get") for p in self.parents)
        if numbering.active and index.__class__ is int:
            self._stamp_item(index)
        return method(self, index)

    async_get.numbering_wraps = method  # type: ignore[attr-defined]
    return async_get


def overrides(cls: type, name: str, base: type) -> bool:
    """True when a class between ``cls`` and ``base`` defines ``name`` (not this module's
    wrapper of ``base``'s own method)."""
    own = getattr(base, name, None)  # base's own, or what it inherits (_hooks.py)
    for klass in cls.__mro__:
        if klass is base:
            return False
        method = klass.__dict__.get(name)
        if method is not None and getattr(method, "numbering_wraps", method) is not own:
            return True
    return False


def _writes_async_next(cls: type) -> bool:
    """True for a block written with ``async_next`` (not an ``__iter__`` generator)."""
    from ._base import IterDataPipe

    return overrides(cls, "async_next", IterDataPipe)


def _numbered(method: Any) -> Any:
    @functools.wraps(method)
    def async_next(self: Any) -> Any:
        numbering = self._numbering()
        if numbering.active is None:
            numbering.active = originates_positions(self)
            if not numbering.active and _writes_async_next(type(self)):
                numbering.outputs = numbering.outputs or OutputStamps()
        if not numbering.active:
            outputs = numbering.outputs
            if outputs is None:  # an __iter__ generator: GeneratorRun numbers its outputs
                return method(self)
            expected = outputs.before_call()
            try:
                item = method(self)
            except NotAvailable:
                outputs.after_wait(expected)
                raise
            outputs.after_output(expected)
            return item
        total, index = numbering.shard
        key = numbering.key
        if key is None:
            key = numbering.key = (self.epoch_seed(), self._epoch_number())
        seed, epoch = key
        while True:
            # The item about to be made is keyed: item_rng() in the user's code (as
            # self._key_next_item(position), inlined: this runs once per item).
            _ITEM.stamp = (seed, epoch, numbering.count * total + index, 0)
            item = method(self)
            count = numbering.count
            numbering.count = count + 1
            position = count * total + index
            if position >= numbering.skip_before:
                self._stamp_item(position)
                return item

    async_next.numbering_wraps = method  # type: ignore[attr-defined]
    return async_next


def _recording_shard(method: Any) -> Any:
    @functools.wraps(method)
    def sharding_settings(self: Any, total: int, index: int) -> None:
        method(self, total, index)
        self._numbering().shard = (total, index)

    sharding_settings.numbering_wraps = method  # type: ignore[attr-defined]
    return sharding_settings
