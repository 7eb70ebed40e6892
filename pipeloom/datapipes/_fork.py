"""Copying one stream to several consumers."""

from __future__ import annotations

import copy as _copy
from collections import deque
from typing import Any

from .._validate import check_int
from ._base import IterDataPipe
from ._context import current_stamp, restore_stamp
from ._state_fields import StateFields

__all__ = ["Forker", "fork", "forked"]


def check_hub_args(op: str, source: Any, num_instances: Any, buffer_size: Any) -> None:
    """Validate the arguments shared by ``fork`` and ``demux``."""
    if not isinstance(source, IterDataPipe):
        raise TypeError(
            f"{op}() expects an IterDataPipe as its source, got {type(source).__name__}; "
            f"convert a MapDataPipe with .to_iter() or wrap iterables with IterableWrapper(...)"
        )
    check_int("num_instances", num_instances, minimum=1)
    if buffer_size != -1 or isinstance(buffer_size, bool):
        check_int("buffer_size", buffer_size, minimum=1, hint="use -1 for an unbounded buffer")


def buffer_full_error(
    op: str, buffer_size: int, ahead: int, behind: int, gap: int, idle: bool = False
) -> BufferError:
    """``idle``: the child behind has read nothing this epoch (perhaps nothing reads it)."""
    unread = (
        f" (child {behind} has read no item yet: if the pipeline never reads it, make only "
        f"as many children as it reads)"
        if idle
        else ""
    )
    return BufferError(
        f"{op} buffer of {buffer_size} items is full: child {behind} is {gap} items behind "
        f"child {ahead}{unread}; consume the children more evenly, or raise buffer_size "
        f"(buffer_size=-1 means unbounded)"
    )


def fork(
    source: IterDataPipe, num_instances: int, buffer_size: int = 1000, copy: str | None = None
) -> list[IterDataPipe]:
    """Copy ``source`` to ``num_instances`` streams that each yield every item.

    By default every child gets the same item object; ``copy="shallow"`` or
    ``"deep"`` gives each child its own ``copy.copy``/``copy.deepcopy`` of it
    (torchdata's argument), for children that change their items.

    Items read by one child and not yet by all are held in a shared buffer; a
    child that is ``buffer_size`` items ahead of another raises ``BufferError``
    when it asks for more (``-1``: unbounded). As in torchdata, the buffer may
    hold one item more than ``buffer_size``: the one read to see whether the
    source has ended. With ``num_instances=1`` the source itself is returned.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> a, b = fork(IterableWrapper(range(3)), 2)
        >>> list(a.zip(b))
        [(0, 0), (1, 1), (2, 2)]
    """
    return forked("fork", source, num_instances, buffer_size, copy)


def forked(
    op: str, source: IterDataPipe, num_instances: int, buffer_size: int, copy: str | None = None
) -> list[IterDataPipe]:
    """:func:`fork` for ``op`` (``"unzip"``): its errors name ``op``, as the user wrote it."""
    check_hub_args(op, source, num_instances, buffer_size)
    if copy not in _COPIES:
        raise ValueError(f"copy must be None, 'shallow' or 'deep', got {copy!r}")
    if num_instances == 1:
        return [source]
    hub = _ForkHub(source, num_instances, buffer_size, op)
    return [Forker(hub, index, copy) for index in range(num_instances)]


_COPIES = {None: None, "shallow": _copy.copy, "deep": _copy.deepcopy}


class _ForkHub(IterDataPipe):
    """The state shared by the children of one ``fork``: one buffer, one offset per child."""

    inputs = ("source",)
    read_by_several = True  # every child reads it (refuse_shared_streams)

    def __init__(
        self, source: IterDataPipe, num_instances: int, buffer_size: int, op: str = "fork"
    ) -> None:
        self.source = source
        self.num_instances = num_instances
        self.buffer_size = buffer_size
        self._op = op  # the function the user called, for its errors
        self.reset()

    def reset(self) -> None:
        self._items: deque[Any] = deque()
        self._stamps: deque[Any] = deque()
        self._base = 0  # source position of self._items[0]
        self._offsets = [0] * self.num_instances  # next source position of each child
        self._ended = False

    def async_next(self) -> Any:
        raise TypeError("_ForkHub is internal to fork(); iterate the children it returned")

    def next_for(self, child: int) -> Any:
        """The next item for ``child``; ``NotAvailable``/``StopIteration`` as a block."""
        offsets, items = self._offsets, self._items
        offset = offsets[child]
        local = offset - self._base
        if local >= len(items):
            if self._ended:
                raise StopIteration
            try:
                item = self.source.async_next()  # read even when full: the end needs no room
            except StopIteration:
                self._ended = True
                raise
            items.append(item)
            self._stamps.append(current_stamp())
        if local >= self.buffer_size != -1:
            behind = offsets.index(self._base)
            idle = offsets[behind] == 0
            raise buffer_full_error(self._op, self.buffer_size, child, behind, local, idle)
        item = items[local]
        restore_stamp(self._stamps[local])
        offsets[child] = offset + 1
        if local == 0:
            self._trim()
        return item

    def _trim(self) -> None:
        low = min(self._offsets)
        items, stamps = self._items, self._stamps
        while self._base < low:
            items.popleft()
            stamps.popleft()
            self._base += 1

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {
            "items": list(self._items),
            "stamps": list(self._stamps),
            "base": self._base,
            "offsets": list(self._offsets),
            "ended": self._ended,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        items = fields.list("items")
        stamps = fields.stamps("stamps", length=len(items))
        base = fields.int("base")
        offsets = fields.list("offsets")
        held = range(base, base + len(items) + 1)
        if len(offsets) != self.num_instances or not all(
            type(o) is int and o in held for o in offsets
        ):
            fields.fail(
                "offsets",
                f"{self.num_instances} ints in [base, base + len(items)] = "
                f"[{base}, {base + len(items)}]",
                offsets,
            )
        self._items, self._stamps = deque(items), deque(stamps)
        self._base, self._offsets = base, offsets
        self._ended = fields.bool("ended")

    def __repr__(self) -> str:
        return f"_ForkHub(num_instances={self.num_instances}, buffer_size={self.buffer_size})"


class Forker(IterDataPipe):
    """One output of :func:`fork`: yields every item of the shared source."""

    inputs = ("hub",)

    def __init__(self, hub: _ForkHub, index: int, copy: str | None = None) -> None:
        self.hub = hub
        self.index = index
        self.copy_mode = copy
        self._copy = _COPIES[copy]

    def async_next(self) -> Any:
        item = self.hub.next_for(self.index)
        return item if self._copy is None else self._copy(item)

    def __len__(self) -> int:
        return len(self.hub)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        hub = self.hub
        copied = "" if self.copy_mode is None else f", copy={self.copy_mode!r}"
        return (
            f"Forker(index={self.index}, num_instances={hub.num_instances}, "
            f"buffer_size={hub.buffer_size}{copied})"
        )
