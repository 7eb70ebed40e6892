"""The sharding point: where a reading service splits a stream across workers."""

from __future__ import annotations

from typing import Any

from .._validate import check_index, check_int
from ._base import IterDataPipe
from ._pipeline import is_sharding_root
from ._state_fields import StateFields

__all__ = ["ShardingFilter"]


def check_sharding_group(sharding_group_filter: Any) -> None:
    """Refuse torchdata's per-group sharding points (``SHARDING_PRIORITIES``), with how to port."""
    name = getattr(sharding_group_filter, "name", sharding_group_filter)
    if sharding_group_filter is None or name == "DEFAULT":
        return
    raise ValueError(
        f"sharding_filter(sharding_group_filter={sharding_group_filter!r}) is not needed: "
        f"pipeloom splits the data across ranks and worker processes at one sharding "
        f"point, each worker of each rank keeping its own shard. Keep one "
        f"sharding_filter() without the argument and remove the other"
    )


class ShardingFilter(IterDataPipe):
    """Keep one shard of the stream (functional: ``sharding_filter``).

    Counting every item the source yields in this epoch as position ``p``, shard
    ``index`` of ``total`` keeps the items with ``(p // group_size) % total ==
    index``, so the shards partition the stream and each keeps its order. Every
    kept item is stamped with ``p``: per-item randomness (``item_rng``) depends
    on the position, not on which worker reads it.

    Until a reading service calls :meth:`sharding_settings` there is one shard
    (everything passes). Calling it again replaces the previous settings.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> dp = ShardingFilter(IterableWrapper(range(10)))
        >>> dp.sharding_settings(3, 1)
        >>> list(dp)
        [1, 4, 7]
        >>> dp.set_shard_group_size(2)
        >>> list(dp)
        [2, 3, 8, 9]
    """

    inputs = ("source",)
    _root: bool | None = None

    def __init__(self, source: IterDataPipe) -> None:
        self.source = source
        self.total = 1
        self.index = 0
        self.group_size = 1
        self._position = 0
        self._resume_from = 0

    def is_shardable(self) -> bool:
        return True

    def sharding_settings(self, total: int, index: int) -> None:
        """Keep shard ``index`` of ``total`` (replaces earlier settings)."""
        check_int("total", total, minimum=1, hint="use total=1 to keep every item")
        check_index("index", index, total, hint=f"shards are numbered 0 .. {total - 1}")
        self.total, self.index = total, index

    def set_shard_group_size(self, group_size: int) -> None:
        """Send runs of ``group_size`` consecutive positions to the same shard."""
        self.group_size = check_int(
            "group_size",
            group_size,
            minimum=1,
            hint="use group_size=1 to deal items out one at a time",
        )

    def reset(self) -> None:
        self._position = 0
        self._resume_from = 0
        self._root: bool | None = None  # decided at the first item of the epoch

    def resume_at(self, position: int) -> None:
        """Drop every item before ``position`` (the prefix is replayed, not processed)."""
        self._resume_from = position

    def async_next(self) -> Any:
        source = self.source
        total, index, group = self.total, self.index, self.group_size
        while True:
            item = source.async_next()
            position = self._position
            self._position = position + 1
            if position < self._resume_from:
                continue
            if total == 1 or (position // group) % total == index:
                if self._root is None:
                    self._root = is_sharding_root(self)
                if self._root:  # below another sharding point: keep its positions
                    self._stamp_item(position)
                return item

    def __len__(self) -> int:
        length = len(self.source)
        total, group = self.total, self.group_size
        groups, rest = divmod(length, group)
        count = (groups // total + (1 if self.index < groups % total else 0)) * group
        if groups % total == self.index:
            count += rest
        return count

    def state_dict(self) -> dict[str, Any]:
        return {"position": self._position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._position = StateFields(self, state).int("position")

    def __repr__(self) -> str:
        extra = f", group_size={self.group_size}" if self.group_size != 1 else ""
        return f"ShardingFilter(total={self.total}, index={self.index}{extra})"
