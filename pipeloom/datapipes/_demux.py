"""Splitting one stream into several by a classifier."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from .._validate import check_bool
from ._base import IterDataPipe
from ._context import current_stamp, restore_stamp
from ._fork import buffer_full_error, check_hub_args
from ._state_fields import StateFields

__all__ = ["Demultiplexer", "demux", "demuxed"]


def demux(
    source: IterDataPipe,
    num_instances: int,
    classifier_fn: Callable[[Any], int | None],
    drop_none: bool = False,
    buffer_size: int = 1000,
) -> list[IterDataPipe]:
    """Split ``source`` into ``num_instances`` streams: item ``x`` goes to ``classifier_fn(x)``.

    Items read from the source for a child other than the one asking wait in a
    buffer; once it holds more than ``buffer_size`` items in all (``-1``:
    unbounded) the asking child raises ``BufferError`` (as in torchdata, the
    item that overflows it is kept, not lost). ``classifier_fn`` returning
    None drops the item when ``drop_none`` is true and is an error otherwise.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> even, odd = demux(IterableWrapper(range(6)), 2, lambda x: x % 2)
        >>> list(even), list(odd)
        ([0, 2, 4], [1, 3, 5])
    """
    return demuxed("demux", source, num_instances, classifier_fn, drop_none, buffer_size)


def demuxed(
    op: str,
    source: IterDataPipe,
    num_instances: int,
    classifier_fn: Callable[[Any], int | None],
    drop_none: bool = False,
    buffer_size: int = 1000,
) -> list[IterDataPipe]:
    """:func:`demux` for ``op`` (``"round_robin_demux"``): its errors name ``op``."""
    check_hub_args(op, source, num_instances, buffer_size)
    if not callable(classifier_fn):
        raise TypeError(
            f"classifier_fn must be callable (item -> child index), got "
            f"{type(classifier_fn).__name__}"
        )
    check_bool("drop_none", drop_none)
    hub = _DemuxHub(source, num_instances, classifier_fn, drop_none, buffer_size, op)
    return [Demultiplexer(hub, index) for index in range(num_instances)]


class _DemuxHub(IterDataPipe):
    """The state shared by the children of one ``demux``: a queue per child."""

    inputs = ("source",)
    read_by_several = True  # every child reads it (refuse_shared_streams)

    def __init__(
        self,
        source: IterDataPipe,
        num_instances: int,
        classifier_fn: Callable[[Any], int | None],
        drop_none: bool,
        buffer_size: int,
        op: str = "demux",
    ) -> None:
        self.source = source
        self._op = op  # the function the user called, for its errors
        self.num_instances = num_instances
        self.classifier_fn = classifier_fn
        self.drop_none = drop_none
        self.buffer_size = buffer_size
        self.reset()

    def reset(self) -> None:
        self._queues: list[deque[tuple[Any, Any]]] = [deque() for _ in range(self.num_instances)]
        self._held = 0
        self._ended = False

    def async_next(self) -> Any:
        raise TypeError("_DemuxHub is internal to demux(); iterate the children it returned")

    def next_for(self, child: int) -> Any:
        """The next item for ``child``; ``NotAvailable``/``StopIteration`` as a block."""
        queue = self._queues[child]
        if queue:
            self._held -= 1
            item, stamp = queue.popleft()
            restore_stamp(stamp)
            return item
        size = self.buffer_size
        while not self._ended:
            if self._held > size != -1:
                self._raise_full(child)
            try:
                item = self.source.async_next()
            except StopIteration:
                self._ended = True
                break
            target = self._classify(item)
            if target == child:
                return item
            if target is not None:
                self._queues[target].append((item, current_stamp()))
                self._held += 1
        raise StopIteration

    def _raise_full(self, child: int) -> None:
        fullest = max(range(self.num_instances), key=lambda i: len(self._queues[i]))
        raise buffer_full_error(
            self._op, self.buffer_size, child, fullest, len(self._queues[fullest])
        )

    def _classify(self, item: Any) -> int | None:
        target = self.classifier_fn(item)
        if target is None:
            if self.drop_none:
                return None
            raise ValueError(
                f"classifier_fn returned None for item {item!r}; return a child index in "
                f"[0, {self.num_instances}), or pass drop_none=True to drop such items"
            )
        if (
            isinstance(target, bool)
            or not isinstance(target, int)
            or not (0 <= target < self.num_instances)
        ):
            raise ValueError(
                f"classifier_fn returned {target!r} for item {item!r}; expected an int in "
                f"[0, {self.num_instances}) (or None with drop_none=True)"
            )
        return target

    def state_dict(self) -> dict[str, Any]:
        return {"queues": [list(q) for q in self._queues], "ended": self._ended}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        queues = fields.list("queues")
        if len(queues) != self.num_instances:
            fields.fail("queues", f"a list of {self.num_instances} queues (one per child)", queues)
        self._queues = [deque(fields.stamped_items("queues", value=q)) for q in queues]
        self._held = sum(len(q) for q in self._queues)
        self._ended = fields.bool("ended")

    def __repr__(self) -> str:
        fn = getattr(self.classifier_fn, "__qualname__", repr(self.classifier_fn))
        return (
            f"_DemuxHub(num_instances={self.num_instances}, classifier_fn={fn}, "
            f"drop_none={self.drop_none}, buffer_size={self.buffer_size})"
        )


class Demultiplexer(IterDataPipe):
    """One output of :func:`demux`: the items classified to its index."""

    inputs = ("hub",)

    def __init__(self, hub: _DemuxHub, index: int) -> None:
        self.hub = hub
        self.index = index

    def async_next(self) -> Any:
        return self.hub.next_for(self.index)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        hub = self.hub
        fn = getattr(hub.classifier_fn, "__qualname__", repr(hub.classifier_fn))
        return (
            f"Demultiplexer(index={self.index}, num_instances={hub.num_instances}, "
            f"classifier_fn={fn}, drop_none={hub.drop_none}, buffer_size={hub.buffer_size})"
        )
