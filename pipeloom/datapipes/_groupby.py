"""``groupby``: collect items with the same key into groups."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from ._base import IterDataPipe
from ._context import current_stamp, restore_stamp
from ._map import check_callable, fn_name

__all__ = ["Grouper"]


def _check_size(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")


class Grouper(IterDataPipe):
    """Collect items by ``group_key_fn`` into lists (functional: ``groupby``).

    Items wait in a buffer, grouped by key. A group is yielded when it reaches
    ``group_size``; when the buffer holds ``buffer_size`` items the largest
    group leaves it (yielded if it has at least ``guaranteed_group_size``
    items, else dropped with ``drop_remaining`` or an error); at the end of
    the stream the remaining groups are yielded in the order their keys first
    appeared. Each group carries the stamp of its first item.

    Args:
        source: the upstream block.
        group_key_fn: the key of an item.
        keep_key: yield ``(key, group)`` instead of ``group``.
        buffer_size: items held at most (None: no limit).
        group_size: yield a group as soon as it has this many items.
        guaranteed_group_size: the smallest group a full buffer may yield
            (defaults to ``group_size``; needs ``group_size``).
        drop_remaining: drop a too-small group when the buffer is full,
            instead of raising.

    Example:
        >>> import os
        >>> from pipeloom.datapipes import IterableWrapper
        >>> files = IterableWrapper(["a.png", "b.png", "a.json", "b.json", "a.jpg", "c.json"])
        >>> stem = lambda path: os.path.splitext(path)[0]
        >>> list(files.groupby(stem))
        [['a.png', 'a.json', 'a.jpg'], ['b.png', 'b.json'], ['c.json']]
        >>> list(files.groupby(stem, group_size=2))
        [['a.png', 'a.json'], ['b.png', 'b.json'], ['a.jpg'], ['c.json']]
    """

    inputs = ("source",)
    # Why a checkpoint holding groups does not resume on another number of ranks
    # (reading_service/distributed/elastic.py): moving them would split groups.
    elastic_refusal: ClassVar[str] = (
        "holds unfinished groups: on other ranks a group's held items and its items still "
        "to be read could reach different ranks, which would split it"
    )

    def __init__(
        self,
        source: IterDataPipe,
        group_key_fn: Callable[[Any], Any],
        *,
        keep_key: bool = False,
        buffer_size: int | None = 10000,
        group_size: int | None = None,
        guaranteed_group_size: int | None = None,
        drop_remaining: bool = False,
    ) -> None:
        check_callable(group_key_fn, "group_key_fn", "groupby", 1)
        for name, value in (
            ("buffer_size", buffer_size),
            ("group_size", group_size),
            ("guaranteed_group_size", guaranteed_group_size),
        ):
            _check_size(name, value)
        if group_size is not None and buffer_size is not None and group_size > buffer_size:
            raise ValueError(
                f"group_size ({group_size}) must be <= buffer_size ({buffer_size}): a group "
                f"must fit in the buffer"
            )
        if guaranteed_group_size is not None and (
            group_size is None or guaranteed_group_size > group_size
        ):
            raise ValueError(
                f"guaranteed_group_size ({guaranteed_group_size}) needs group_size set and at "
                f"least as large (got group_size={group_size})"
            )
        self.source = source
        self.group_key_fn = group_key_fn
        self.keep_key = bool(keep_key)
        self.buffer_size = buffer_size
        self.group_size = group_size
        if guaranteed_group_size is None and group_size is not None and buffer_size is not None:
            guaranteed_group_size = group_size
        self.guaranteed_group_size = guaranteed_group_size
        self.drop_remaining = bool(drop_remaining)
        self.reset()

    def reset(self) -> None:
        self._groups: dict[Any, tuple[list[Any], tuple]] = {}  # key -> (items, first stamp)
        self._held = 0
        self._flushing: list[Any] | None = None  # keys left to yield after the end

    def async_next(self) -> Any:
        while self._flushing is None:
            try:
                item = self.source.async_next()
            except StopIteration:
                self._flushing = list(self._groups)
                break
            out = self._add(item)
            if out is not None:
                return out
        while self._flushing:
            return self._emit(self._flushing.pop(0))
        raise StopIteration

    def _add(self, item: Any) -> Any:
        key = self.group_key_fn(item)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = ([], current_stamp())
        group[0].append(item)
        self._held += 1
        if self.group_size is not None and len(group[0]) == self.group_size:
            return self._emit(key)
        if self._held == self.buffer_size:
            return self._evict_largest()
        return None

    def _evict_largest(self) -> Any:
        key = max(self._groups, key=lambda k: len(self._groups[k][0]))
        size = len(self._groups[key][0])
        guaranteed = self.guaranteed_group_size
        if guaranteed is None or size >= guaranteed:
            return self._emit(key)
        if not self.drop_remaining:
            raise RuntimeError(
                f"groupby(): the buffer of {self.buffer_size} items is full and its largest "
                f"group (key {key!r}) has {size} items, fewer than guaranteed_group_size="
                f"{guaranteed}; raise buffer_size, or pass drop_remaining=True to drop it"
            )
        items, _ = self._groups.pop(key)
        self._held -= len(items)
        return None

    def _emit(self, key: Any) -> Any:
        items, stamp = self._groups.pop(key)
        self._held -= len(items)
        restore_stamp(stamp)
        return (key, items) if self.keep_key else items

    def state_dict(self) -> dict[str, Any]:
        return {
            "groups": [(key, list(items), stamp) for key, (items, stamp) in self._groups.items()],
            "flushing": None if self._flushing is None else list(self._flushing),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._groups = {key: (list(items), tuple(stamp)) for key, items, stamp in state["groups"]}
        self._held = sum(len(items) for items, _ in self._groups.values())
        flushing = state["flushing"]
        self._flushing = None if flushing is None else list(flushing)

    def __repr__(self) -> str:
        return (
            f"Grouper(group_key_fn={fn_name(self.group_key_fn)}, keep_key={self.keep_key}, "
            f"buffer_size={self.buffer_size}, group_size={self.group_size}, "
            f"guaranteed_group_size={self.guaranteed_group_size}, "
            f"drop_remaining={self.drop_remaining})"
        )
