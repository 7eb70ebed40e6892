"""What a block declares and overrides: its traits and hooks, with their defaults.

A block's class sets traits (``per_item``, ``one_to_one``, ...) that tell the
planner where it may run, and overrides the hooks it needs (``lazy_init``,
``is_shardable``, ``state_dict``, ...). :class:`BlockHooks` holds their
defaults and docs; the block base (``_base.py``) adds the graph, the seeds and
the framework's own state, which it alone touches.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> mapper = IterableWrapper(range(3)).map(str)
    >>> mapper.one_to_one, mapper.is_shardable(), mapper.batches_of()
    (True, False, None)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ..events import ReadinessSource
from ._numbering import overrides

__all__ = ["BlockHooks"]


class BlockHooks:
    """The traits a block declares and the hooks it may override, with their defaults."""

    #: Placement trait: True when each output depends on a single input item
    #: (map, filter, decode, ...), so a reading service may run the block inside
    #: workers after the sharding point. Blocks that need the ordered stream
    #: (shuffle, batch, zip, ...) keep False and run after the workers' merge.
    per_item: ClassVar[bool] = False
    #: True when the block yields exactly one output per input (map, collate).
    one_to_one: ClassVar[bool] = False
    #: True when the block yields at most one output per input (filter); implied
    #: by ``one_to_one``. Lets the workers' merge move on without waiting.
    at_most_one: ClassVar[bool] = False
    #: True when the block stamps its outputs' positions itself (:meth:`stamp_position`).
    stamps_positions: ClassVar[bool] = False
    #: False when the block's stream is produced once per epoch elsewhere (the main
    #: process's stand-in for workers or a separate process): a block after it that
    #: restarts it mid-epoch (``cycle``, ``mux(stop="cycle")``) then raises, instead
    #: of reading a stream that has ended.
    restartable: ClassVar[bool] = True
    #: Attributes that may differ between a job's ranks: where or how fast, not which items.
    per_rank_fields: ClassVar[tuple[str, ...]] = ()
    #: Arguments a checkpoint may be loaded with changed: ``load_state_dict`` adapts to them.
    resume_may_change: ClassVar[tuple[str, ...]] = ()

    @property
    def restarts_inputs(self) -> bool:
        """True when the block restarts an input on its own mid-epoch when it runs out
        (``cycle``, ``mux(stop="cycle")``): each input must then be a branch of its own,
        not a child of a ``fork`` or ``demux`` that another branch reads."""
        return False

    def lazy_init(self) -> None:
        """Expensive setup, run once where the block runs, before first use."""

    def is_shardable(self) -> bool:
        """True when a reading service may split this block's work across workers."""
        return False

    def sharding_settings(self, total: int, index: int) -> None:
        """Keep only shard ``index`` of ``total`` (called only on shardable blocks)."""

    def set_shard_group_size(self, group_size: int) -> None:
        """Optional: give runs of ``group_size`` positions to one shard (batches in workers)."""
        raise NotImplementedError(f"{type(self).__name__} cannot shard in groups of positions")

    def can_shard_in_groups(self) -> bool:
        """True when this block implements :meth:`set_shard_group_size`."""
        return overrides(type(self), "set_shard_group_size", BlockHooks)

    def batches_of(self) -> int | None:
        """``n`` when each output combines a run of ``n`` consecutive inputs (a batch), else None.

        A placement trait: workers given runs of ``n`` positions build whole outputs.
        """
        return None

    def is_separate_process(self) -> bool:
        """True when this block should run in a process of its own."""
        return False

    def reset(self) -> None:
        """Forget this block's own iteration state; the next item starts an epoch.

        Parents are reset by the framework; a block only resets itself.
        """

    def set_epoch(self, epoch: int) -> None:
        """Called when the epoch changes; ``self.epoch_seed()`` already reflects it."""

    def readiness_sources(self) -> Sequence[ReadinessSource]:
        """Where to wait when this block raises ``NotAvailable`` (e.g. a thread's signal)."""
        return ()

    def state_dict(self) -> dict[str, Any]:
        """This block's own mid-epoch state (not its parents'), as a plain dict."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement state_dict(), so a pipeline "
            f"containing it cannot be checkpointed; implement state_dict() and "
            f"load_state_dict() on {type(self).__name__}, or return {{}} if it keeps "
            f"no state between items"
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if state:
            raise NotImplementedError(f"{type(self).__name__} does not implement load_state_dict()")
