"""Blocks that hold items between two outputs, and how several ranks' held items are shared out.

A shuffle buffer, packing bins and length buckets read items they pass on
later. When an epoch resumes on another number of ranks
(``reading_service/distributed/elastic.py``), the items such a block held on
the old ranks have been read but not delivered: every new rank's block gets
every old rank's state and keeps its :class:`HeldShare` of the *units* held
(an item, a bin, a batch: what the block passes on whole), dealt out by a
rule every new rank computes alike, so each unit goes to exactly one new
rank whatever the timing, and the ranks' counts differ by at most one unit
(``uneven="shortest"`` then drops at most that much, not all of them). A
block says how with :meth:`HoldsItems.load_held_states`; a block after the
sharding point that holds items without it makes such a resume refuse.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Sequence
from typing import Any, TypeVar

from ..errors import StateError
from ._base import DataPipe
from ._pipeline import upstream_blocks
from ._state_fields import StateFields

__all__ = ["HeldShare", "HoldsItems", "held_stamped_items", "load_held", "share_of"]

T = TypeVar("T")


class HeldShare:
    """Which of the old ranks' held units new rank ``index`` of ``total`` takes.

    Every new rank deals the same units in the same order (the blocks by
    their place in the pipeline, each its old ranks' states in rank order),
    so the shares are disjoint and together are every unit. Unit ``k``,
    counted over every :meth:`take` of this share, goes to rank
    ``total - 1 - k % total``: the last ranks first, because the first ranks
    take the extra groups when the rest of the epoch splits unevenly.

    Example:
        >>> first, last = HeldShare(0, 2), HeldShare(1, 2)
        >>> first.take("abcde"), last.take("abcde")
        (['b', 'd'], ['a', 'c', 'e'])
        >>> first.take("f"), last.take("f")  # the count goes on across takes
        (['f'], [])
    """

    def __init__(self, index: int = 0, total: int = 1) -> None:
        if not (isinstance(total, int) and total >= 1 and isinstance(index, int)):
            raise ValueError(f"expected ints total >= 1 and index, got {index!r}, {total!r}")
        if not 0 <= index < total:
            raise ValueError(f"expected an index in 0 .. {total - 1}, got {index}")
        self.index = index
        self.total = total
        self.dealt = 0  # units dealt so far, to every rank

    def take(self, units: Sequence[T]) -> list[T]:
        """This rank's units of ``units`` (the next ones in the dealing order)."""
        first, total = self.dealt, self.total
        self.dealt += len(units)
        mine = total - 1 - self.index
        return [unit for k, unit in enumerate(units, first) if k % total == mine]

    def __repr__(self) -> str:
        return f"HeldShare(index={self.index}, total={self.total})"


class HoldsItems(abc.ABC):
    """A block whose state between outputs is the items it holds (and nothing else to keep).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> a = IterableWrapper([[1, 1, 1], [2, 2], [3, 3]]).pack(4)
        >>> b = IterableWrapper([[7, 7], [8, 8, 8, 8]]).pack(4)
        >>> _ = next(iter(a)), next(iter(b))  # each still holds an open bin: [1, 1, 1], [7, 7]
        >>> merged = IterableWrapper([]).pack(4)
        >>> rest = iter(merged)  # a new epoch starts, then takes the held items
        >>> merged.load_held_states([a.state_dict(), b.state_dict()])
        >>> [values.tolist() for values, _, _ in rest]
        [[1, 1, 1, 0], [7, 7, 0, 0]]
        >>> rest = iter(merged)  # as new rank 1 of 2: the first bin (rank 0 takes the second)
        >>> merged.load_held_states([a.state_dict(), b.state_dict()], HeldShare(1, 2))
        >>> [values.tolist() for values, _, _ in rest]
        [[1, 1, 1, 0]]
    """

    @abc.abstractmethod
    def load_held_states(
        self, states: list[dict[str, Any]], share: HeldShare | None = None
    ) -> None:
        """Start the rest of an epoch holding this rank's ``share`` of the items of ``states``.

        Each state is this block's ``state_dict()`` on an old rank, taken at
        the same step; every new rank gets them all. Collect the units held
        (whatever the block passes on whole: an item, a bin, a batch) in a
        fixed order (state by state) and keep ``share.take(units)`` (all of
        them when ``share`` is None), so each unit is passed on by exactly
        one new rank. The block is fresh (reset) when this is called. Check
        each state as ``load_state_dict`` checks one (e.g. load each in turn
        and collect its items), so a damaged one raises ``StateError``
        naming the block and the field.
        """


def share_of(share: HeldShare | None, units: Sequence[T]) -> list[T]:
    """``share.take(units)``, or every unit when there is no share (one new rank)."""
    return list(units) if share is None else share.take(units)


def held_stamped_items(
    block: Any, states: list[dict[str, Any]], field: str, share: HeldShare | None = None
) -> list[Any]:
    """This rank's share of the stamped items under ``field`` of every rank's state of
    ``block``, each state checked as ``load_state_dict`` checks one (its ``"ended"`` too,
    though the rest of the epoch is not ended), for a block whose held items are that
    one list."""
    items: list[Any] = []
    for state in states:
        fields = StateFields(block, state)
        fields.bool("ended")
        items.extend(fields.stamped_items(field))
    return share_of(share, items)


def load_held(pipeline: DataPipe, held: dict[str, Any] | None) -> None:
    """Give the blocks of a restarted ``pipeline`` this new rank's share of the held items.

    ``held`` (``reading_service/distributed/elastic.py``'s ``held_states``) is
    ``{"index", "total", "uneven", "blocks"}``: this new rank, the new number
    of ranks, the service's ``uneven``, and ``blocks``, which maps a block's
    index in ``upstream_blocks(pipeline)`` to its state on each old rank that
    held items there. A block whose ``load_held_states`` takes no share gets
    them all on new rank 0 under ``uneven="pad"`` (the others repeat their
    shard meanwhile), and refuses under ``"shortest"`` (which would drop them).
    """
    if not held:
        return
    if not isinstance(held.get("blocks"), dict) or not {"index", "total"} <= set(held):
        raise StateError(
            f"expected the held items as {{'index', 'total', 'uneven', 'blocks'}} "
            f"(held_states()), got {sorted(held, key=repr)!r}; join the ranks' states with "
            f"merge_rank_states() and load the result"
        )
    blocks = upstream_blocks(pipeline)
    share = HeldShare(held["index"], held["total"])
    for index in sorted(held["blocks"]):
        states = held["blocks"][index]
        block = blocks[index] if 0 <= index < len(blocks) else None
        if not isinstance(block, HoldsItems):
            saved = (held.get("types") or {}).get(index, "a block that holds items")
            raise StateError(
                f"the rest of this epoch hands the items {saved} held on the old ranks to "
                f"block #{index} of the part this rank runs in its own thread, but {block!r} "
                f"is there: the pipeline differs from the checkpoint's, or the old ranks ran "
                f"that block in their own thread and these run it in workers (or the other "
                f"way round); resume with the pipeline and the inner reading service the "
                f"checkpoint was saved with, or save at a step where it holds nothing"
            )
        if _takes_a_share(block):
            block.load_held_states(states, share)
        elif share.total == 1 or held.get("uneven") == "pad":
            if share.index == 0:  # one new rank takes them all
                block.load_held_states(states)
        else:
            raise StateError(
                f"{block!r} held items on the old ranks, and {type(block).__name__}"
                f".load_held_states(states) takes no share (HeldShare) to spread them over the "
                f"{share.total} new ranks: "
                f"one rank would hold them all, and uneven='shortest' would drop them when the "
                f"others run out first; resume on as many ranks as saved the checkpoint, or "
                f"with uneven='pad', or give load_held_states a share argument and keep "
                f"share.take(units) of the units it holds"
            )


def _takes_a_share(block: HoldsItems) -> bool:
    try:
        inspect.signature(block.load_held_states).bind([], None)
    except TypeError:
        return False
    return True
