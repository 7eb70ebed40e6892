"""Fused runs: many items through a chain of per-item blocks in one loop.

A consumer that wants many items at once (``batch``) reads them through a
:class:`RunReader` instead of calling ``async_next`` once per item and block.
The reader finds the chain ending at its block: the *stages* (``map``,
``filter``, a ``sharding_filter`` below the sharding root; ``set_length``
passes through) and the block that feeds them, the *head*: a source read by
position (a sequence, a file listing, a map-style block through ``to_iter``,
the sharding root over one of those, which then reads only its shard), an
iterator, or any other block, read with its ``async_next``. A run takes each
item through every stage before the next one (item-major), stamping it once,
so every stage sees the stamp the blocks run one by one would give it.

What the blocks run one by one would do, a run does too:

- it never takes from the head more than it processed: when stage ``k``
  raises on item ``i``, the items before ``i`` are in ``out`` and the blocks'
  state is just past ``i`` (as if ``i`` had been pulled through ``async_next``);
- ``NotAvailable`` from the head ends the run with what it has;
- the blocks' positions are written back after every run, so a checkpoint
  between runs, or ``async_next`` on any block of the chain, sees the state
  the blocks would have;
- where the loop cannot do what the blocks would (stamp watchers are
  installed, an epoch seed is still to be drawn from torch's generator, the
  sharding filter's count and its source's position disagree), the run takes
  items one by one through ``async_next`` instead.

Only the built-in blocks fuse, through their ``_run_stage`` / ``_run_head``
methods, and only while their class keeps their own ``async_next``: a custom
block, or a subclass that overrides ``async_next``, is a boundary read with
``async_next``. Multi-output blocks (``flatmap``, ``unbatch``, tar readers)
are boundaries too.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> pipe = IterableWrapper(range(10)).sharding_filter().map(lambda x: x * 10)
    >>> pipe = pipe.filter(lambda x: x % 20 == 0)
    >>> out = []
    >>> RunReader(pipe).extend(out, 4)
    >>> out
    [0, 20, 40, 60]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from types import CodeType
from typing import Any, Protocol

from ..errors import NotAvailable
from ._base import DataPipe, IterDataPipe
from ._context import _ITEM
from ._seek import kept_span, read_span

__all__ = ["DROP", "Head", "PullHead", "RunReader", "SeekHead", "Stage"]


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


DROP: Any = _Drop()
"""What a stage returns for an item it drops (a filter)."""


def _pulled(next_item: Callable[[], Any], count: int) -> Iterable[Any]:
    """Up to ``count`` results of ``next_item()``, ending at its ``StopIteration``.

    Not ``iter(next_item, sentinel)``: that compares every item with the
    sentinel, and ``==`` on a tensor or array is an elementwise operation.
    """
    for _ in range(count):
        try:
            item = next_item()
        except StopIteration:
            return
        yield item


class Stage:
    """One per-item block in a run: ``apply(item)`` returns the output or :data:`DROP`.

    ``note(error)`` re-raises an error of ``apply`` noted as the block's
    ``async_next`` would note it (``map``: "raised by the function of ...");
    None when ``apply`` notes its own. A stage with state keeps it in its
    block, as the block's ``async_next`` does.
    """

    __slots__ = ("apply", "note", "drops")

    def __init__(
        self,
        apply: Callable[[Any], Any],
        note: Callable[[Exception], None] | None,
        *,
        drops: bool = False,
    ):
        self.apply = apply
        self.note = note
        self.drops = drops  # may return DROP


class Stamper(Protocol):
    """What a run's loop stamps each item with: a block's epoch seed and epoch."""

    def epoch_seed(self) -> int | None: ...

    def _epoch_number(self) -> int: ...


class Head:
    """Where a run's items come from.

    Attributes:
        stamper: the block whose item stamp the loop sets on each item (its
            epoch seed and epoch, the item's position); None when the head's
            block stamps its items itself.
        seed_blocks: the blocks that stamp in the unfused run: the loop runs
            only once their epoch seeds need no draw from torch's generator.
    """

    stamper: Stamper | None = None
    seed_blocks: tuple[DataPipe, ...] = ()

    def ready(self) -> bool:
        """True when a fused run would do exactly what the blocks one by one would."""
        for block in self.seed_blocks:
            if block._drawn_epoch_seed() is None and block._block_seed() is None:
                return False  # its first stamp draws from torch's generator
        return True

    def span(self, count: int) -> tuple[Iterable[Any], int, int] | None:
        """``(items, first position, step)`` for up to ``count`` items; None at the end.

        ``items`` is read lazily where reading runs code that may fail, so the
        run stops at the failing item.
        """
        raise NotImplementedError

    def advance(self, last: int) -> None:
        """The run took the items through position ``last`` (first - step: none)."""

    def bulk(self, out: list[Any], count: int) -> bool:
        """Append up to ``count`` items with no stage to run; False at the end."""
        span = self.span(count)
        if span is None:
            return False
        items, first, step = span
        before = len(out)
        try:
            out.extend(items)
        finally:
            taken = len(out) - before
            if taken:
                self.advance(first + (taken - 1) * step)
        if taken and self.stamper is not None:
            _stamp(self.stamper, first + (taken - 1) * step)
        return taken > 0


class SeekHead(Head):
    """A head that reads a sequence by position, maybe one shard of it.

    Subclasses say where this epoch stands (:meth:`start`), what the items are
    (:meth:`items`), which shard (``total``, ``index``, ``group``), and write
    the position back (:meth:`advance`, :meth:`at_end`).
    """

    total, index, group = 1, 0, 1

    def start(self) -> int:
        raise NotImplementedError

    def items(self) -> Sequence[Any]:
        raise NotImplementedError

    def at_end(self, length: int) -> None:
        """No kept position is left: record the end as the blocks would."""

    def read(self, items: Sequence[Any], positions: range) -> Iterable[Any]:
        return read_span(items, positions)

    def span(self, count: int) -> tuple[Iterable[Any], int, int] | None:
        items = self.items()
        length = len(items)
        positions = kept_span(
            self.start(), length, total=self.total, index=self.index, group=self.group, count=count
        )
        if positions is None:
            self.at_end(length)
            return None
        return self.read(items, positions), positions.start, positions.step


class SourceHead(SeekHead):
    """A positioned source read whole (``_seek.py``): the source stamps, no shard."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.stamper = source
        self.seed_blocks = (source,)

    def start(self) -> int:
        return self.source._next_position()

    def items(self) -> Sequence[Any]:
        return self.source._positioned_items()

    def advance(self, last: int) -> None:
        self.source._move_to(last + 1)

    def at_end(self, length: int) -> None:
        self.source._move_to(max(length, self.source._next_position()))


class IteratorHead(Head):
    """A source that iterates: lazily sliced, positions counted from the source's."""

    def __init__(self, source: Any, iterator: Callable[[], Any], *, stamps: bool = True):
        self.source = source
        self.iterator = iterator
        self.stamper = source if stamps else None  # None: the iterator stamps and counts
        self.seed_blocks = (source,)  # (``_wrappers._marking``: keeping the user's draws)

    def span(self, count: int) -> tuple[Iterable[Any], int, int]:
        return islice(self.iterator(), count), self.source._next_position(), 1

    def advance(self, last: int) -> None:
        self.source._move_to(last + 1)


class PullHead(Head):
    """Any other block: read with its own ``async_next`` (which stamps its items)."""

    def __init__(self, block: IterDataPipe) -> None:
        self.block = block
        kind = type(block)
        self._many = kind.async_next_many is not IterDataPipe.async_next_many

    def span(self, count: int) -> tuple[Iterable[Any], int, int]:
        return _pulled(self.block.async_next, count), 0, 1

    def bulk(self, out: list[Any], count: int) -> bool:
        if self._many:  # the block's own many-items read (a source's slice)
            try:
                out.extend(self.block.async_next_many(count))
            except StopIteration:
                return False
            return True
        before = len(out)
        append, next_item = out.append, self.block.async_next
        try:
            for _ in range(count):
                append(next_item())
        except StopIteration:
            pass
        return len(out) > before


def _stamp(block: Stamper, position: int) -> None:
    """One store of the item stamp: ``block``'s epoch seed, epoch and ``position``."""
    _ITEM.stamp = (block.epoch_seed(), block._epoch_number(), position, 0)


def owns_async_next(block: DataPipe, hook: str) -> bool:
    """True when ``block``'s ``async_next`` is the one of the class defining ``hook``.

    A subclass that overrides ``async_next`` keeps the hook of its base, which
    would then describe code that no longer runs: it is not fused.
    """
    cls = type(block)
    for klass in cls.__mro__:
        if hook in klass.__dict__:
            return klass.__dict__.get("async_next") is cls.__dict__.get(
                "async_next", getattr(cls, "async_next", None)
            )
    return False


class _Chain:
    """The head and stages found upstream of one block, for one epoch."""

    def __init__(self, block: IterDataPipe) -> None:
        self.block = block
        stages: list[Stage] = []
        owners: list[DataPipe] = []
        node: Any = block
        head: Head | None = None
        while True:
            if owns_async_next(node, "_run_head"):
                head = node._run_head()
                if head is not None:
                    break
            if not owns_async_next(node, "_run_stage"):
                head = PullHead(node)
                break
            stage = node._run_stage()
            if stage is not None:
                stages.append(stage)
                owners.append(node)
            node = node.source
        stages.reverse()
        owners.reverse()
        self.head = head
        self.stages = tuple(stages)
        self.owners = tuple(owners)  # the block of each stage
        self.fns = tuple(stage.apply for stage in stages)
        self.notes = tuple(stage.note for stage in stages)
        self.drops = any(stage.drops for stage in stages)
        self._last = 0  # the last position a run took

    def extend(self, out: list[Any], count: int) -> None:
        before = len(out)
        target = before + count
        head = self.head
        try:
            while len(out) < target:
                if _ITEM.watchers or not head.ready():
                    out.append(self.block.async_next())  # the blocks one by one
                elif self.fns:
                    if not self._run(out, target):
                        raise StopIteration
                elif not head.bulk(out, target - len(out)):
                    raise StopIteration
        except (NotAvailable, StopIteration):
            if len(out) == before:
                raise

    def _run(self, out: list[Any], target: int) -> bool:
        """Items of one span through every stage into ``out``; False at the head's end."""
        head = self.head
        span = head.span(target - len(out))
        if span is None:
            return False
        items, first, step = span
        self._last = first - step
        took = False
        try:
            if head.stamper is None:  # the head's block stamps its items
                took = self._loop(items, out.append)
            else:
                self._stamped_loop(items, first, step, out.append)
                took = self._last != first - step
        finally:
            if self._last != first - step:
                head.advance(self._last)
        return took

    def _stamped_loop(self, items: Iterable[Any], first: int, step: int, append: Any) -> None:
        """Stamp each item, run it through the stages; ``_last``: the last position taken.

        Three shapes of the same loop, the fastest one that fits the stages.
        """
        stamper = self.head.stamper
        assert stamper is not None
        seed, epoch = stamper.epoch_seed(), stamper._epoch_number()
        stamps = _ITEM.__dict__  # this thread's: one dict store per item
        fns, last, k = self.fns, first - step, 0
        try:
            if len(fns) == 1 and not self.drops:
                fn = fns[0]
                for item in items:
                    last += step
                    stamps["stamp"] = (seed, epoch, last, 0)
                    try:
                        append(fn(item))
                    except Exception as error:
                        self._note(0, error)
            elif not self.drops:
                for item in items:
                    last += step
                    stamps["stamp"] = (seed, epoch, last, 0)
                    k = 0
                    try:
                        for fn in fns:
                            item = fn(item)
                            k += 1
                    except Exception as error:
                        self._note(k, error)
                    append(item)
            else:
                for item in items:
                    last += step
                    stamps["stamp"] = (seed, epoch, last, 0)
                    k = 0
                    try:
                        for fn in fns:
                            item = fn(item)
                            if item is DROP:
                                break
                            k += 1
                        else:
                            append(item)
                    except Exception as error:
                        self._note(k, error)
        finally:
            self._last = last

    def _loop(self, items: Iterable[Any], append: Any) -> bool:
        """The stages over items the head stamped; False when there was none."""
        fns, took = self.fns, False
        for item in items:
            took, k = True, 0
            try:
                for fn in fns:
                    item = fn(item)
                    if item is DROP:
                        break
                    k += 1
                else:
                    append(item)
            except Exception as error:
                self._note(k, error)
        return took

    def _note(self, k: int, error: Exception) -> None:
        """Re-raise ``error`` of stage ``k``, noted as its block does."""
        note = self.notes[k]
        if note is not None:
            note(error)
        raise error


def running_stage(chain: object, callee: CodeType) -> DataPipe | None:
    """The block whose stage runs ``callee``, called from a fused loop of ``chain``.

    For code that looks at running threads (statistics): in a fused run, a
    ``map``'s function is called by the run's loop, not by its block's
    ``async_next``, so the block is found from the stage's function. None when
    ``callee`` is no stage's (the head reading items).
    """
    if not isinstance(chain, _Chain):
        return None
    for stage, owner in zip(chain.stages, chain.owners):
        function = getattr(stage.apply, "__func__", stage.apply)
        if getattr(function, "__code__", None) is callee:
            return owner
    return None


RUN_LOOP_CODES: frozenset[CodeType] = frozenset(
    {_Chain._stamped_loop.__code__, _Chain._loop.__code__}
)
"""The code of the fused loops, which call the stages' functions directly."""


class RunReader:
    """Reads runs of items from ``block`` (see the module docstring).

    Build one per epoch (after the pipeline was reset): it finds the chain at
    the first run and keeps it.
    """

    __slots__ = ("block", "_chain")

    def __init__(self, block: IterDataPipe) -> None:
        self.block = block
        self._chain: _Chain | None = None

    def extend(self, out: list[Any], count: int) -> None:
        """Append between 1 and ``count`` items of ``block`` to ``out``.

        Raises ``NotAvailable`` / ``StopIteration`` only when it appended
        nothing. An error of a block propagates after the items before it were
        appended. The thread's item stamp afterwards is the last item's.
        """
        chain = self._chain
        if chain is None:
            chain = self._chain = _Chain(self.block)
        chain.extend(out, count)

    def positioned(self, count: int) -> tuple[range, list[Any]] | None:
        """Up to ``count`` items with their positions, read as one slice.

        Only when ``block`` is a head read by position (a sequence, the
        sharding root over one) with no stage to run; None otherwise, and
        nothing was read: read with ``async_next``. Raises ``StopIteration``
        at the end. The thread's item stamp afterwards is the last item's.
        """
        chain = self._chain
        if chain is None:
            chain = self._chain = _Chain(self.block)
        head = chain.head
        if chain.fns or not isinstance(head, SeekHead) or head.stamper is None:
            return None
        if _ITEM.watchers or not head.ready():
            return None
        span = head.span(count)
        if span is None:
            raise StopIteration
        items, first, step = span
        values = list(items)
        if not values:
            raise StopIteration
        last = first + (len(values) - 1) * step
        head.advance(last)
        _stamp(head.stamper, last)
        return range(first, last + 1, step), values
