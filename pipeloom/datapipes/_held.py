"""Blocks that hold items between two outputs, and how several ranks' held items become one's.

A shuffle buffer, packing bins and length buckets read items they pass on
later. When an epoch resumes on another number of ranks
(``reading_service/distributed/elastic.py``), the items such a block held on
each old rank have been read but not delivered: they go, as they are, to
one new rank (old rank ``r`` to new rank ``r % new_ranks``), whose block
starts the rest of the epoch holding all of them. A block says how with
:meth:`HoldsItems.load_held_states`; a block after the sharding point that
holds items without it makes such a resume refuse.
"""

from __future__ import annotations

import abc
from typing import Any

from ..errors import StateError
from ._base import DataPipe
from ._pipeline import upstream_blocks
from ._state_fields import StateFields

__all__ = ["HoldsItems", "held_stamped_items", "load_held"]


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
    """

    @abc.abstractmethod
    def load_held_states(self, states: list[dict[str, Any]]) -> None:
        """Start the rest of an epoch holding the items of every state in ``states``.

        Each state is this block's ``state_dict()`` on another rank, taken at
        the same step; every held item must be passed on exactly once, in any
        order. The block is fresh (reset) when this is called. Check each
        state as ``load_state_dict`` checks one (e.g. load each in turn and
        collect its items), so a damaged one raises ``StateError`` naming
        the block and the field.
        """


def held_stamped_items(block: Any, states: list[dict[str, Any]], field: str) -> list[Any]:
    """The stamped items under ``field`` of every rank's state of ``block``, each state
    checked as ``load_state_dict`` checks one (its ``"ended"`` too, though the rest of
    the epoch is not ended), for a block whose held items are that one list."""
    items: list[Any] = []
    for state in states:
        fields = StateFields(block, state)
        fields.bool("ended")
        items.extend(fields.stamped_items(field))
    return items


def load_held(pipeline: DataPipe, held: dict[int, list[dict[str, Any]]] | None) -> None:
    """Give the blocks of a restarted ``pipeline`` the items other ranks held.

    ``held`` maps a block's index in ``upstream_blocks(pipeline)`` to the
    states it had on the old ranks handed to this one.
    """
    if not held:
        return
    blocks = upstream_blocks(pipeline)
    for index, states in held.items():
        block = blocks[index] if 0 <= index < len(blocks) else None
        if not isinstance(block, HoldsItems):
            raise StateError(
                f"the rest of this epoch hands held items to block #{index}, but this pipeline "
                f"has {block!r} there; resume with the pipeline the checkpoint was saved with"
            )
        block.load_held_states(states)
