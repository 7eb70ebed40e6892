"""The rest of an epoch after a resume on another number of ranks: the positions no one delivered.

Before the checkpoint, ``old_total`` ranks split the epoch's positions in
groups of ``group_size`` (group ``q = p // group_size`` belonged to rank
``q % old_total``). Old rank ``r`` delivered every group of its own before
``frontiers[r]`` and, of group ``frontiers[r]``, its first ``skips[r]``
outputs. The groups no one delivered, in order, are numbered again from 0:
that *virtual* group number is what the new sharding (ranks and workers)
splits, so the rest is dealt out evenly, each group to exactly one new shard.
Items keep their real positions (``item_rng`` draws do not change).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._state_fields import StateFields

__all__ = ["RestOfEpoch"]


@dataclass(frozen=True)
class RestOfEpoch:
    """The groups of positions left to deliver (see the module docstring).

    ``start`` is the first virtual position still to read (a resume of a
    checkpoint taken during the rest).

    Example:
        >>> rest = RestOfEpoch(group_size=1, old_total=2, frontiers=(4, 3), skips=(0, 0))
        >>> [rest.virtual(p) for p in range(7)]
        [None, None, None, 0, 1, 2, 3]
    """

    group_size: int
    old_total: int
    frontiers: tuple[int, ...]
    skips: tuple[int, ...]
    start: int = 0
    _skip_at: dict[int, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for rank, (frontier, skip) in enumerate(zip(self.frontiers, self.skips)):
            if skip and frontier % self.old_total == rank:
                self._skip_at[self._undelivered_before(frontier)] = skip

    def virtual(self, position: int) -> int | None:
        """The virtual position of ``position``, or None when it was delivered."""
        group, offset = divmod(position, self.group_size)
        if group < self.frontiers[group % self.old_total]:
            return None
        return self._undelivered_before(group) * self.group_size + offset

    def skip(self, virtual_group: int) -> int:
        """How many outputs of ``virtual_group`` were delivered before the checkpoint."""
        return self._skip_at.get(virtual_group, 0)

    def from_virtual(self, start: int) -> RestOfEpoch:
        """The same rest, read from virtual position ``start`` on."""
        return RestOfEpoch(self.group_size, self.old_total, self.frontiers, self.skips, start)

    def _undelivered_before(self, group: int) -> int:
        total, delivered = self.old_total, 0
        for rank, frontier in enumerate(self.frontiers):
            end = min(group, frontier)
            if end > rank:
                delivered += (end - rank + total - 1) // total
        return group - delivered

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint."""
        return {
            "group_size": self.group_size,
            "old_total": self.old_total,
            "frontiers": list(self.frontiers),
            "skips": list(self.skips),
            "start": self.start,
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> RestOfEpoch:
        """Read :meth:`to_dict`'s output back (``StateError`` when damaged)."""
        fields = StateFields("the rest of the epoch", state)
        old_total = fields.int("old_total", minimum=1)
        frontiers, skips = state.get("frontiers"), state.get("skips")
        for name, value in (("frontiers", frontiers), ("skips", skips)):
            if not (
                isinstance(value, (list, tuple))
                and len(value) == old_total
                and all(isinstance(x, int) and x >= 0 for x in value)
            ):
                fields.fail(name, f"{old_total} non-negative ints, one per old rank", value)
        return cls(
            fields.int("group_size", minimum=1),
            old_total,
            tuple(frontiers),  # type: ignore[arg-type]
            tuple(skips),  # type: ignore[arg-type]
            fields.int("start"),
        )
