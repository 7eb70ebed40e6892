"""Where an economic or chunked epoch resumes: the dispatcher's checkpoint.

A resume point is ``(position, taken, delivered)``: the sharding point
resumes at ``position``; of the items it makes there the first ``taken``
were in units delivered before the checkpoint (a record reader stamps several
items of one position, ``stamp_position(p, output=j)``, and a unit may end
inside them), so they are dropped before any worker sees them; of the outputs
of the rest, the first ``delivered`` at ``position`` were delivered (inside a
unit that made several outputs, or a relayed chunk's batches), so they are
dropped on the way out. Three numbers per worker pool, whatever the epoch.

The reading side counts the items of the current keyed position
(:meth:`ResumePoint.read`); each unit knows the point before its first item
and after its last; the delivering side counts the outputs of the unit being
delivered at its last output's position.
"""

from __future__ import annotations

from typing import Any

from ....datapipes.runtime import key_position
from ....errors import StateError

__all__ = ["ResumePoint"]

Point = tuple[int, int, int]


class ResumePoint:
    """The dispatcher's resume point, kept as items are read and outputs delivered."""

    def __init__(self) -> None:
        self.point: Point = (0, 0, 0)  # (position, taken, delivered): where a resume starts
        self._base = (0, 0)  # this epoch's own start: (position, taken)
        self._drop_position, self._drop = 0, 0  # items still to drop at the source
        self._skip_position, self._skip = 0, 0  # outputs still to drop on the way out
        self._keyed_at = (-1, 0)  # the last keyed item read: its position, items of it read
        self._start = (0, 0)  # the unit being delivered: its first position, items before it
        self._end: Point | None = None  # and the point after it
        self._at = (-1, 0)  # its last output delivered: position, outputs of it in the unit

    def resume(self, position: int, taken: int, delivered: int, *, here: bool = True) -> None:
        """Start this epoch at ``(position, taken, delivered)`` (before reading); ``here``:
        the outputs delivered are dropped here (else by the workers: relayed chunks)."""
        self.point = (position, taken, delivered)
        self._base = (position, taken)
        self._drop_position, self._drop = position, taken
        self._skip_position, self._skip = position, delivered if here else 0

    @property
    def dropping(self) -> bool:
        """Items of the resume position are still to be dropped at the source."""
        return self._drop > 0

    # -- reading ------------------------------------------------------------------
    def read(self, key: Any) -> bool:
        """Count the item ``key`` just read (a keyed one, or any while :attr:`dropping`);
        False when it is dropped (taken before the resume)."""
        position = key_position(key)
        if key.__class__ is tuple:
            at, count = self._keyed_at
            self._keyed_at = (position, count + 1 if position == at else 1)  # type: ignore[assignment]
        if self._drop:
            if position == self._drop_position:
                self._drop -= 1
                return False
            raise self._too_few(f"before moving on to position {position}")
        return True

    def ended(self) -> None:
        """The source ended: raise StateError if items of the resume position were still
        to be dropped (the state took more of its last position than the data has)."""
        if self._drop:
            raise self._too_few("before the epoch ended")

    def _too_few(self, then: str) -> StateError:
        return StateError(
            f"the state resumes the epoch at position {self._drop_position} after "
            f"{self._base[1]} of the items made there, but the sharding point made only "
            f"{self._base[1] - self._drop} there {then}: the data changed since the state "
            "was saved (or the state was edited), and resuming would skip or repeat items. "
            "Restore the data as it was, or start this epoch over without the state"
        )

    def before(self, key: Any) -> tuple[int, int]:
        """``(position, items of it before)`` of the item ``key`` just read (a unit's start)."""
        if key.__class__ is tuple:
            position, count = self._keyed_at
            return position, count - 1
        return key, 0

    def after(self, position: int) -> Point:
        """The point after the item at ``position`` just read (a unit's end): the next
        position, or, after a keyed item (more of its position may follow), the items
        of it read."""
        at, count = self._keyed_at
        if position == at:
            return at, count, 0
        return position + 1, 0, 0

    # -- delivering ---------------------------------------------------------------
    def unit(self, start: tuple[int, int], end: Point, outputs: int) -> None:
        """The outputs of the unit from ``start`` to ``end`` are delivered next."""
        if not outputs:
            self.point = end
            return
        self._start, self._end, self._at = start, end, (-1, 0)

    def deliver(self, key: Any) -> bool:
        """Count the output ``key`` of the unit; True when it is dropped (delivered
        before the resume)."""
        position = key_position(key)
        at, count = self._at
        count = count + 1 if position == at else 1
        self._at = (position, count)  # type: ignore[assignment]
        start, taken = self._start
        self.point = (position, taken if position == start else 0, count)  # type: ignore[assignment]
        if self._skip and position == self._skip_position:
            self._skip -= 1
            return True
        return False

    def deliver_run(self, keys: list[Any]) -> None:
        """``deliver`` for outputs none of which is dropped, in one step."""
        last = key_position(keys[-1])
        at_last = 1
        for key in reversed(keys[:-1]):
            if key_position(key) != last:
                break
            at_last += 1
        at, count = self._at
        count = count + at_last if at_last == len(keys) and last == at else at_last
        self._at = (last, count)  # type: ignore[assignment]
        start, taken = self._start
        self.point = (last, taken if last == start else 0, count)  # type: ignore[assignment]

    @property
    def skipping(self) -> bool:
        return self._skip > 0

    def unit_done(self) -> None:
        """Every output of the unit was delivered: a resume starts after it."""
        if self._end is not None:
            self.point, self._end = self._end, None

    def relayed(self, after: tuple[int, int]) -> None:
        """A relayed batch was delivered; ``after``: its last output's position and the
        outputs of it delivered (counted from this epoch's start, after ``taken``)."""
        position, delivered = after
        base, taken = self._base
        self.point = (position, taken if position == base else 0, delivered)
