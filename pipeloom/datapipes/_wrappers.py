"""Sources: plain Python iterables, sequences and torch datasets as blocks."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from types import AsyncGeneratorType, GeneratorType
from typing import Any

import torch.utils.data

from .._validate import check_index, check_int
from ._base import DataPipe, IterDataPipe, MapDataPipe
from ._context import _ITEM
from ._listing_check import ListingMemo, changed_strings, describe_strings
from ._runs import Head, IteratorHead, SeekHead, SourceHead
from ._seek import first_kept, is_positioned, read_span
from ._state_fields import StateFields

__all__ = ["IterableWrapper", "MapToIter", "SequenceWrapper", "as_datapipe"]


_PLAIN_ITERABLES: tuple[type, ...] = (
    dict,
    deque,
    type({}.keys()),
    type({}.values()),
    type({}.items()),
)
"""Built-in iterables not read by position whose iteration runs no code of the user's."""


def _marking(block: IterableWrapper, items: Iterator[Any], position: int) -> Iterator[Any]:
    """``items`` from ``position`` on, each keyed before it is made (``_key_next_item``).

    The stamp then holds the draws the user's code made for the item (a block
    downstream draws after those), and the block's position counts it, so a
    fused run reading this iterator (``IteratorHead``) leaves both as they are.
    """
    take = items.__next__
    seed, epoch, current = block.epoch_seed(), block._epoch_number(), _ITEM
    while True:
        current.stamp = (seed, epoch, position, 0)  # as block._key_next_item(position)
        try:
            item = take()
        except StopIteration:
            return
        position += 1
        block._position = position
        yield item


class IterableWrapper(IterDataPipe):
    """Yield the items of a re-iterable object (a list, a range, a torch ``IterableDataset``).

    Each epoch calls ``iter(iterable)`` again. A one-shot iterator (e.g. a
    generator object) can be read for one epoch only; a generator cannot be
    copied to worker threads or spawned processes (a ``TypeError`` says so). A ``set`` or
    ``frozenset`` is read in sorted order: its own order follows the string
    hash seed, which differs between runs, workers and ranks, so positions
    (shards, checkpoints) would point at other items there.

    Example:
        >>> list(IterableWrapper(range(3)))
        [0, 1, 2]
    """

    def __init__(self, iterable: Iterable[Any]) -> None:
        if not isinstance(iterable, Iterable) or isinstance(iterable, DataPipe):
            hint = (
                "it is already a block; use it directly"
                if isinstance(iterable, DataPipe)
                else "wrap map-style datasets with SequenceWrapper"
            )
            raise TypeError(
                f"IterableWrapper expects an iterable such as a list, range or "
                f"IterableDataset, got {type(iterable).__name__}; {hint}"
            )
        self.iterable = iterable
        self._unordered = isinstance(iterable, (set, frozenset))
        if isinstance(iterable, (set, frozenset)):
            _check_sortable(iterable)
        self._one_shot = iter(iterable) is iterable if isinstance(iterable, Iterator) else False
        self._positioned = is_positioned(iterable)  # read by index: seek, shard at the source
        self._it: Iterator[Any] | None = None
        self._position = 0
        self._started_once = False
        self._listing_memo = ListingMemo()  # a list of paths hashed once, not per checkpoint

    def describe_data(self, *, contents: bool = False) -> dict[str, str] | None:
        """What a loader's checkpoint records of a list of paths or URLs (see
        ``_listing_check``): the strings, and with ``contents`` the local files' sizes
        and times; None for other iterables."""
        return describe_strings(
            self.iterable, contents=contents, memo=getattr(self, "_listing_memo", None)
        )

    def changed_data(self, saved: dict[str, Any]) -> list[str]:
        """What changed since ``saved`` (``describe_data``'s), one line each."""
        return changed_strings(self.iterable, saved)

    def reset(self) -> None:
        if self._one_shot and self._started_once:
            raise RuntimeError(
                f"IterableWrapper was given a one-shot iterator ({type(self.iterable).__name__}), "
                f"which was already consumed; pass a re-iterable object such as a list, or "
                f"an object whose __iter__ returns a fresh generator"
            )
        self._it = None
        self._position = 0

    def async_next(self) -> Any:
        position = self._position
        if self._positioned:
            try:
                item = self.iterable[position]  # type: ignore[index]
            except IndexError:
                raise StopIteration from None
        else:
            it = self._it
            if it is None:
                it = self._it = self._start()
            item = next(it)
        self._position = position + 1
        self._stamp_item(position)
        return item

    def async_next_many(self, limit: int) -> list[Any]:
        position = self._position
        if self._positioned:
            span = range(position, min(position + limit, len(self.iterable)))  # type: ignore[arg-type]
            items = list(read_span(self.iterable, span))  # type: ignore[arg-type]
        else:
            it = self._it
            if it is None:
                it = self._it = self._start()
            items = list(islice(it, limit))
        if not items:
            raise StopIteration
        position += len(items)
        self._position = position
        self._stamp_item(position - 1)
        return items

    # -- a positioned source (``_seek.py``): read by the sharding point and fused runs --
    def _run_head(self) -> Head:
        if self._positioned:
            return SourceHead(self)
        return IteratorHead(self, self._iterator, stamps=not self._marks())

    def _iterator(self) -> Iterator[Any]:
        it = self._it
        if it is None:
            it = self._it = self._start()
        return it

    def _positioned_items(self) -> Sequence[Any] | None:
        return self.iterable if self._positioned else None  # type: ignore[return-value]

    def _next_position(self) -> int:
        return self._position

    def _move_to(self, position: int) -> None:
        self._position = position

    def shared_data(self) -> tuple[Any, ...]:
        """A built-in sequence is only read: thread copies share it (``runtime.read_only_data``)."""
        return (self.iterable,) if self._positioned else ()

    def _marks(self) -> bool:
        """Whether the user's code makes each item (``_marking`` keys it first)."""
        return not (self._unordered or type(self.iterable) in _PLAIN_ITERABLES)

    def _start(self) -> Iterator[Any]:
        self._started_once = True
        if self._unordered:  # a set: sorted, so no code of the user's runs
            it = iter(sorted(self.iterable))
        else:
            it = iter(self.iterable)
        if self._marks():
            it = _marking(self, it, 0)  # the user's iterator makes each item
        if self._position:  # resume: fast-forward to the saved position (at C speed)
            next(islice(it, self._position, self._position), None)
        return it

    def state_dict(self) -> dict[str, Any]:
        return {"position": self._position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        position = fields.int("position")
        try:
            length = len(self.iterable)  # type: ignore[arg-type]
        except TypeError:
            length = None
        if length is not None and position > length:
            fields.fail("position", f"an int in [0, {length}] (the source's length)", position)
        self._it = None
        self._position = position

    def __len__(self) -> int:
        try:
            return len(self.iterable)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"IterableWrapper over {type(self.iterable).__name__} has no length"
            ) from None

    def __getstate__(self) -> dict[str, Any]:
        # Copied for worker threads, pickled for spawned processes: a generator cannot be.
        # (A one-shot iterator that can, such as itertools.count(), is copied at its place.)
        if isinstance(self.iterable, (GeneratorType, AsyncGeneratorType)):
            raise TypeError(
                f"IterableWrapper was given a one-shot iterator ({type(self.iterable).__name__}), "
                f"which cannot be copied to worker threads or spawned processes (and is read "
                f"for one epoch only); pass a re-iterable object such as a list, or an object "
                f"whose __iter__ returns a fresh generator"
            )
        state = super().__getstate__()
        state["_it"] = None
        return state

    def __repr__(self) -> str:
        return f"IterableWrapper({_short_repr(self.iterable)})"


class SequenceWrapper(MapDataPipe):
    """Random access to a sequence or a torch map-style ``Dataset``.

    Example:
        >>> dp = SequenceWrapper(["a", "b", "c"])
        >>> dp[1], len(dp)
        ('b', 3)
    """

    def __init__(self, sequence: Any) -> None:
        if not (hasattr(sequence, "__getitem__") and hasattr(sequence, "__len__")):
            raise TypeError(
                f"SequenceWrapper expects an object with __getitem__ and __len__ (a list, "
                f"a tuple, a map-style Dataset), got {type(sequence).__name__}; wrap "
                f"iterables without random access with IterableWrapper"
            )
        if isinstance(sequence, DataPipe):
            raise TypeError("SequenceWrapper was given a block; use the block directly")
        self.sequence = sequence

    def __getitem__(self, index: int) -> Any:
        if not isinstance(index, int):
            return self.sequence[index]
        if not is_positioned(self.sequence):  # the user's __getitem__ makes the item
            self._key_next_item(index)
        item = self.sequence[index]
        self._stamp_item(index)
        return item

    def async_get_many(self, indices: Sequence[int]) -> list[Any]:
        sequence = self.sequence
        if is_positioned(sequence):
            items = [sequence[i] for i in indices]
        else:  # each keyed before the user's __getitem__ makes it
            items = []
            for i in indices:
                self._key_next_item(i)
                items.append(sequence[i])
        if items:
            self._stamp_item(indices[-1])
        return items

    def __len__(self) -> int:
        return len(self.sequence)

    def shared_data(self) -> tuple[Any, ...]:
        """A built-in sequence is only read: thread copies share it (``runtime.read_only_data``)."""
        return (self.sequence,) if is_positioned(self.sequence) else ()

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return f"SequenceWrapper({_short_repr(self.sequence)})"


class MapToIter(IterDataPipe):
    """Iterate a map-style block by index ``0 .. len-1``.

    It is a sharding point: with ``sharding_settings(total, index)`` it reads
    only the indices of its shard (runs of ``group_size`` consecutive indices
    go to the same shard), stamping each item with its index.

    Example:
        >>> list(MapToIter(SequenceWrapper("xyz")))
        ['x', 'y', 'z']
    """

    inputs = ("source",)

    def __init__(self, source: MapDataPipe) -> None:
        if not isinstance(source, MapDataPipe):
            raise TypeError(f"MapToIter expects a MapDataPipe, got {type(source).__name__}")
        self.source = source
        self.num_shards = 1
        self.shard_index = 0
        self.group_size = 1
        self._index = 0
        self._length: int | None = None

    def is_shardable(self) -> bool:
        return True

    def sharding_settings(self, total: int, index: int) -> None:
        _check_shard(total, index)
        self.num_shards, self.shard_index = total, index

    def resume_at(self, position: int) -> None:
        """Start this epoch at index ``position`` (the first of this shard's at or after it)."""
        self._index = self._first_index_from(position)

    def set_shard_group_size(self, group_size: int) -> None:
        """Give runs of ``group_size`` consecutive indices to the same shard."""
        self.group_size = check_int("group_size", group_size, minimum=1)

    def reset(self) -> None:
        self._index = self._first_index_from(0)
        self._length = None

    def _first_index_from(self, index: int) -> int:
        """The first index >= ``index`` that belongs to this shard."""
        return first_kept(
            index, total=self.num_shards, index=self.shard_index, group=self.group_size
        )

    def _epoch_length(self) -> int:
        if self._length is None:
            self._length = len(self.source)
        return self._length

    def async_next(self) -> Any:
        index = self._index
        length = self._epoch_length()
        if index >= length:
            raise StopIteration
        item = self.source.async_get(index)
        self._index = index + 1 if self.num_shards == 1 else self._first_index_from(index + 1)
        self._stamp_item(index)
        return item

    def async_next_many(self, limit: int) -> list[Any]:
        index = self._index
        length = self._epoch_length()
        if index >= length:
            raise StopIteration
        stop = min(length, index + limit)
        if self.num_shards > 1:  # stay inside this shard's current run of indices
            stop = min(stop, (index // self.group_size + 1) * self.group_size)
        items = self.source.async_get_many(range(index, stop))
        self._index = stop if self.num_shards == 1 else self._first_index_from(stop)
        self._stamp_item(stop - 1)
        return items

    def _run_head(self) -> Head:
        return _MapToIterHead(self)

    def __len__(self) -> int:
        total = len(self.source)
        if self.num_shards == 1:
            return total
        return sum(
            1 for i in range(total) if (i // self.group_size) % self.num_shards == self.shard_index
        )

    def state_dict(self) -> dict[str, Any]:
        return {"index": self._index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._index = StateFields(self, state).int("index")
        self._length = None

    def __repr__(self) -> str:
        shard = f", shard={self.shard_index}/{self.num_shards}" if self.num_shards > 1 else ""
        return f"MapToIter({self.source!r}{shard})"


class _MapToIterHead(SeekHead):
    """A fused run's head over :class:`MapToIter`: this shard's indices, read with ``async_get``."""

    def __init__(self, block: MapToIter) -> None:
        self.block = block
        self.stamper = block
        source = block.source
        stamps = type(source) is SequenceWrapper  # the blocks that stamp when run one by one
        self.seed_blocks = (block, source) if stamps else (block,)
        sequence = getattr(source, "sequence", None)
        plain = type(source) is SequenceWrapper and is_positioned(sequence)
        self._sequence = sequence if plain else None  # read directly: no user code runs

    @property
    def total(self) -> int:  # type: ignore[override]
        return self.block.num_shards

    @property
    def index(self) -> int:  # type: ignore[override]
        return self.block.shard_index

    @property
    def group(self) -> int:  # type: ignore[override]
        return self.block.group_size

    def start(self) -> int:
        return self.block._index

    def items(self) -> Sequence[Any]:
        if self._sequence is not None:
            return self._sequence  # type: ignore[no-any-return]
        return _Indexed(self.block.source.async_get, self.block._epoch_length())

    def advance(self, last: int) -> None:
        self.block._index = self.block._first_index_from(last + 1)


class _Indexed(Sequence[Any]):
    """``async_get`` of a map-style block seen as a sequence of ``length`` items."""

    def __init__(self, get: Any, length: int) -> None:
        self._get, self._length = get, length

    def __getitem__(self, index: Any) -> Any:
        return self._get(index)

    def __len__(self) -> int:
        return self._length


def _check_shard(total: int, index: int) -> None:
    check_int("the number of shards", total, minimum=1)
    check_index("the shard index", index, total)


def as_datapipe(source: Any) -> DataPipe:
    """Turn a block, a torch dataset, a sequence or an iterable into a block.

    Example:
        >>> type(as_datapipe([1, 2])).__name__
        'SequenceWrapper'
    """
    if isinstance(source, DataPipe):
        return source
    if isinstance(source, (str, bytes, bytearray)):
        text = _short_repr(source)
        raise TypeError(
            f"a {type(source).__name__} is not a pipeline source: its items would be its "
            f"characters ({text}); for files write FileLister({text}), for one item "
            f"IterableWrapper([{text}]), and to iterate its characters on purpose "
            f"IterableWrapper({text})"
        )
    if isinstance(source, torch.utils.data.IterableDataset):
        return IterableWrapper(source)
    if (
        hasattr(source, "__getitem__")
        and hasattr(source, "__len__")
        and not isinstance(source, (str, bytes, dict))
    ):
        return SequenceWrapper(source)
    if isinstance(source, Iterable):
        return IterableWrapper(source)
    raise TypeError(
        f"cannot use {type(source).__name__} as a pipeline source: expected an "
        f"IterDataPipe/MapDataPipe, a torch Dataset or IterableDataset, a sequence or an "
        f"iterable"
    )


def _check_sortable(items: set[Any] | frozenset[Any]) -> None:
    try:
        sorted(items)
    except TypeError as error:
        raise TypeError(
            f"IterableWrapper reads a {type(items).__name__} in sorted order (its own order "
            f"changes with each process's string hash seed, so runs, workers and ranks would "
            f"disagree on positions), but these items cannot be sorted ({error}); pass a list "
            f"in the order you want, e.g. sorted(items, key=str)"
        ) from None


def _short_repr(obj: Any, limit: int = 40) -> str:
    text = repr(obj)
    return text if len(text) <= limit else text[: limit - 3] + "..."
