"""The sharding point: where a reading service splits a stream across workers."""

from __future__ import annotations

from typing import Any

from .._validate import check_index, check_int
from ..errors import StateError
from ._base import IterDataPipe
from ._context import _ITEM
from ._global_rngs import GlobalDrawCheck
from ._pipeline import is_sharding_root
from ._rest_of_epoch import RestOfEpoch
from ._runs import DROP, PullHead, SeekHead, Stage, owns_async_next
from ._seek import first_kept
from ._state_fields import StateFields

__all__ = ["ShardingFilter"]

PREFIX_DRAW_CHECKS = 8
"""Items per epoch whose making before a copied sharding point is checked for global draws."""

PREFIX_DRAWS = (
    "a global RNG (random, numpy.random or torch's default generator) was drawn from "
    "while the blocks before a sharding point made an item. Every worker and rank runs "
    "its own copy of those blocks, and each copy draws its own numbers, so the copies can "
    "keep different items: some read twice, others never. Draw from pipeloom.item_rng() "
    "there (the same in every copy), or move the random step after the sharding point. "
    "(Worker threads share the global RNGs, so a draw by another thread shows the same "
    "way; draws from them in worker threads depend on timing: use pipeloom.item_rng().)"
)


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

    With several shards, every worker (and rank) runs its own copy of the
    blocks before this one, and all copies must make the same stream. A draw
    from the global RNGs there (``random``, ``numpy.random``, ``torch.rand``)
    would differ between copies, so they would keep other items: some read
    twice, others never. The first items of each epoch are checked for such
    draws, with a ``RuntimeWarning`` saying what to change.

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
    _seekable: bool | None = None

    def __init__(self, source: IterDataPipe) -> None:
        self.source = source
        self.total = 1
        self.index = 0
        self.group_size = 1
        self._position = 0
        self._resume_from = 0
        self._rest: RestOfEpoch | None = None
        self._draws = GlobalDrawCheck(checks=PREFIX_DRAW_CHECKS, message=PREFIX_DRAWS)

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
        self._rest = None
        self._root: bool | None = None  # decided at the first item of the epoch
        self._seekable: bool | None = None  # likewise
        self._draws.restart()
        if self._block_seed() is None:  # unseeded blocks draw their seeds from torch's RNG
            self._draws.stop()

    def resume_at(self, position: int | RestOfEpoch) -> None:
        """Drop every item before ``position``: skipped at once when the source is
        read by position (a list, a range, ...), else replayed, not processed.

        A :class:`RestOfEpoch` (a resume on another number of ranks) keeps
        instead the positions no one delivered, sharded by their virtual
        position from its ``start`` on.
        """
        if isinstance(position, RestOfEpoch):
            if position.group_size != self.group_size:
                raise StateError(
                    f"the rest of this epoch was saved with sharding groups of "
                    f"{position.group_size} positions, but this pipeline's plan shards in "
                    f"groups of {self.group_size}; resume with the same reading service "
                    f"composition (and the same batch size where the workers batch)"
                )
            self._rest = position
            self._seekable = False  # virtual positions: read every position
        else:
            self._resume_from = position

    def async_next(self) -> Any:
        source = self.source
        total, index, group = self.total, self.index, self.group_size
        if self._rest is not None:
            return self._next_of_rest()
        if self._seekable is None:
            self._seekable = _positioned_source(source) is not None
        if self._seekable and (total > 1 or self._position < self._resume_from):
            if not _ITEM.watchers:
                self._seek()  # shard at the source: jump to the next kept position
        draws = self._draws
        while True:
            if draws.left and total > 1:
                item = self._checked_next(source)
            else:
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

    def _checked_next(self, source: IterDataPipe) -> Any:
        """``source.async_next()``, watched for draws from the global RNGs."""
        draws = self._draws
        if self._seekable:  # a sequence read by position: no code of the user's runs
            draws.stop()
            return source.async_next()
        draws.start()
        try:
            return source.async_next()
        finally:
            draws.done()

    @property
    def position(self) -> int:
        """How many items the source gave this epoch (kept or not): the next one's position."""
        return self._position

    @property
    def rest(self) -> RestOfEpoch | None:
        """The rest of the epoch this epoch reads (a resume on other ranks), or None."""
        return self._rest

    def _next_of_rest(self) -> Any:
        while True:
            item = self.source.async_next()
            position = self._position
            self._position = position + 1
            if self._keeps_in_rest(position):
                if self._root is None:
                    self._root = is_sharding_root(self)
                if self._root:
                    self._stamp_item(position)
                return item

    def _keeps_in_rest(self, position: int) -> bool:
        rest = self._rest
        assert rest is not None
        virtual = rest.virtual(position)
        if virtual is None or virtual < rest.start:
            return False
        return (virtual // self.group_size) % self.total == self.index

    def _seek(self) -> None:
        """Move the source to the next kept position, skipping the others unread."""
        position = self._position
        target = first_kept(
            max(position, self._resume_from),
            total=self.total,
            index=self.index,
            group=self.group_size,
        )
        source: Any = self.source  # a positioned source (``_positioned_source``)
        target = min(target, len(source._positioned_items()))  # the end, as a full pass ends
        if target > position and source._next_position() == position:
            source._move_to(target)
            self._position = target

    # -- fused runs (``_runs.py``) ------------------------------------------------
    def _run_head(self) -> SeekHead | PullHead | None:
        """The root over a positioned source reads only its shard's positions.

        While the blocks before a copied sharding point are watched for global
        draws, it is read with ``async_next``, which watches them.
        """
        if self._root is None:
            self._root = is_sharding_root(self)
        positioned = _positioned_source(self.source) is not None
        if self._root and self._rest is None and positioned:
            return _ShardHead(self)
        if self._draws.left and self.total > 1 and not positioned:
            return PullHead(self)
        return None

    def _run_stage(self) -> Stage:
        """Any other source: count positions, keep this shard's, stamp them at the root."""
        if self._root is None:
            self._root = is_sharding_root(self)
        return Stage(self._keep_or_drop, None, drops=True)

    def _keep_or_drop(self, item: Any) -> Any:
        position = self._position
        self._position = position + 1
        if position < self._resume_from:
            return DROP
        if self._rest is not None:
            if not self._keeps_in_rest(position):
                return DROP
            if self._root:
                self._stamp_item(position)
            return item
        if self.total == 1 or (position // self.group_size) % self.total == self.index:
            if self._root:
                self._stamp_item(position)
            return item
        return DROP

    def __len__(self) -> int:
        length = len(self.source)
        total, group = self.total, self.group_size
        groups, rest = divmod(length, group)
        count = (groups // total + (1 if self.index < groups % total else 0)) * group
        if groups % total == self.index:
            count += rest
        return count

    def state_dict(self) -> dict[str, Any]:
        if self._rest is not None:
            return {"position": self._position, "rest": self._rest.to_dict()}
        return {"position": self._position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._position = StateFields(self, state).int("position")
        rest = state.get("rest")
        if rest is not None:
            self.resume_at(RestOfEpoch.from_dict(rest))

    def __repr__(self) -> str:
        extra = f", group_size={self.group_size}" if self.group_size != 1 else ""
        return f"ShardingFilter(total={self.total}, index={self.index}{extra})"


def _positioned_source(source: Any) -> Any:
    """``source`` when it reads its items by position (``_seek.py``), else None."""
    if not owns_async_next(source, "_positioned_items"):
        return None
    return source if source._positioned_items() is not None else None


class _ShardHead(SeekHead):
    """A fused run's head: the sharding root reading its shard's positions of its source."""

    def __init__(self, block: ShardingFilter) -> None:
        self.block = block
        self.source: Any = block.source
        self.stamper = block
        self.seed_blocks = (block, block.source)

    def ready(self) -> bool:
        return self.source._next_position() == self.block._position and super().ready()

    @property
    def total(self) -> int:  # type: ignore[override]
        return self.block.total

    @property
    def index(self) -> int:  # type: ignore[override]
        return self.block.index

    @property
    def group(self) -> int:  # type: ignore[override]
        return self.block.group_size

    def start(self) -> int:
        return max(self.block._position, self.block._resume_from)

    def items(self) -> Any:
        return self.source._positioned_items()

    def advance(self, last: int) -> None:
        self.block._position = last + 1
        self.source._move_to(last + 1)

    def at_end(self, length: int) -> None:
        end = max(length, self.block._position)
        self.block._position = end
        self.source._move_to(end)
