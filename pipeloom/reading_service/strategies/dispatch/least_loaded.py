"""Which worker gets the next piece of work: the one with the least in flight.

The economic strategy asks it for every item (item workers) and every batch
(batch workers), the chunked strategy for every chunk.
"""

from __future__ import annotations

__all__ = ["LeastLoaded"]


class LeastLoaded:
    """The work in flight on each of ``count`` workers.

    Example:
        >>> workers = LeastLoaded(3)
        >>> [workers.assign(turn) for turn in range(4)]
        [0, 1, 2, 0]
        >>> workers.done(1); workers.assign(0)
        1
    """

    __slots__ = ("loads",)

    def __init__(self, count: int) -> None:
        self.loads = [0] * count

    def assign(self, turn: int, amount: int = 1) -> int:
        """The worker with the least load (ties go round-robin from ``turn``), given ``amount``."""
        loads = self.loads
        count = len(loads)
        best, best_load = 0, None
        for offset in range(count):
            worker = (turn + offset) % count
            if best_load is None or loads[worker] < best_load:
                best, best_load = worker, loads[worker]
        loads[best] += amount
        return best

    def done(self, worker: int, amount: int = 1) -> None:
        """``amount`` of ``worker``'s work came back."""
        self.loads[worker] -= amount
