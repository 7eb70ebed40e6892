"""Which upstream block stamped a kept item, so a replay stamps it as that block would now.

An item's stamp carries the epoch seed of the block that stamped it (a
source, a sharding point). After ``concat``/``mux``/``zip`` several blocks
stamp the items one block keeps (``in_memory_cache``), so a replay that gave
every item one seed would give item 0 of the first source and item 0 of the
second the same ``item_rng()`` draws.
"""

from __future__ import annotations

from typing import Any

from ._pipeline import upstream_blocks

UNKNOWN = -1  # no upstream block's epoch seed (a later round of a cycle, no seed at all)


class StampOwners:
    """Finds, for a stamp's seed, the upstream block whose epoch seed it is.

    ``owner(seed, epoch)`` while the items are kept (an index into
    ``upstream_blocks(block)``, or :data:`UNKNOWN`), ``seed_now(owner)`` while
    they are replayed (that block's seed for the current epoch, drawn where
    it was not yet, as the block itself would draw it).
    """

    def __init__(self, block: Any) -> None:
        self._block = block
        self.start_pass()

    def start_pass(self) -> None:
        """Forget the seeds of the last pass (a new epoch draws new ones)."""
        self._blocks: list[Any] | None = None
        self._last: tuple[int | None, int, int] = (None, -1, UNKNOWN)
        self._now: dict[int, int] = {}

    def _upstream(self) -> list[Any]:
        if self._blocks is None:
            self._blocks = upstream_blocks(self._block)
        return self._blocks

    def owner(self, seed: int | None, epoch: int) -> int:
        """The index of the block that stamped an item with ``seed`` in ``epoch``."""
        last_seed, last_epoch, last_owner = self._last
        if seed == last_seed and epoch == last_epoch:
            return last_owner
        found = UNKNOWN
        if seed is not None:
            for index, block in enumerate(self._upstream()):
                if index and block._round_number() == 0 and block._epoch_number() == epoch:
                    drawn = block._drawn_epoch_seed()
                    if drawn is None and block._block_seed() is not None:
                        # not drawn yet (a resumed pass whose items came from a saved
                        # buffer): derived from the pipeline seed, so no draw is spent
                        drawn = block.epoch_seed()
                    if drawn == seed:
                        found = index
                        break
        self._last = (seed, epoch, found)
        return found

    def describe(self, owner: int) -> list[Any]:
        """What finds ``owner`` again in another copy of the graph (a process that reads
        back what another wrote, whose graph may differ): its class and its place when the
        pipeline was first seeded (None: never seeded, so only this graph's index holds)."""
        block = self._upstream()[owner]
        return [type(block).__name__, block._seed_place()]

    def resolve(self, described: dict[int, list[Any]]) -> dict[int, int] | None:
        """``{owner then: owner in this graph}`` for :meth:`describe`'s ``{owner: ...}``;
        None if one of them is not in this graph."""
        blocks = self._upstream()
        by_place = {
            (type(block).__name__, block._seed_place()): index
            for index, block in enumerate(blocks)
            if index and block._seed_place() is not None
        }
        found = {}
        for owner, (kind, place) in described.items():
            if place is not None:
                index = by_place.get((kind, place))
            elif 0 < owner < len(blocks) and blocks[owner]._seed_place() is None:
                index = owner if type(blocks[owner]).__name__ == kind else None
            else:
                index = None
            if index is None:
                return None
            found[owner] = index
        return found

    def seed_now(self, owner: int) -> int:
        """The current epoch seed of the block at ``owner`` (not :data:`UNKNOWN`)."""
        seed = self._now.get(owner)
        if seed is None:
            seed = self._now[owner] = self._upstream()[owner].epoch_seed()
        return seed


class StampTally:
    """Whether kept items can be replayed with the stamps they would have now.

    Each one's stamping block is known (``owned``), or one seed stamped them all
    (learnt again from a live item); else not (a later round of a cycle).
    """

    def __init__(self) -> None:
        self.owned = True
        self._any_owned = False
        self._unowned_seeds: set[int | None] = set()  # two at most

    def note(self, owner: int, seed: int | None) -> None:
        """Count an item stamped with ``seed`` by ``owner`` (:data:`UNKNOWN` if none)."""
        if owner != UNKNOWN:
            self._any_owned = True
            return
        self.owned = False
        if len(self._unowned_seeds) < 2:
            self._unowned_seeds.add(seed)

    @property
    def replayable(self) -> bool:
        return self.owned or (not self._any_owned and len(self._unowned_seeds) < 2)
