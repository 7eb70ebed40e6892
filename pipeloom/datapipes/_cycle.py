"""Repeating a stream."""

from __future__ import annotations

from typing import Any

from .._validate import check_int
from ._base import IterDataPipe
from ._pipeline import reset_pipeline, set_input_round
from ._state_fields import StateFields

__all__ = ["Cycler"]


class Cycler(IterDataPipe):
    """Repeat the source ``count`` times, or forever when ``count`` is None (functional: ``cycle``).

    Between rounds the source (and everything upstream of it) is restarted with
    ``reset_pipeline``, with new seeds for each round (a seeded shuffle upstream
    reshuffles, reproducibly). An infinite cycle over a source that yields nothing in
    a whole round stops instead of spinning.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(Cycler(IterableWrapper([1, 2]), 3))
        [1, 2, 1, 2, 1, 2]
    """

    inputs = ("source",)
    #: It restarts its input between rounds: a reading service refuses it after its workers.
    restarts_its_input = True

    @property
    def restarts_inputs(self) -> bool:
        return True

    def __init__(self, source: IterDataPipe, count: int | None = None) -> None:
        check_int("count", count, minimum=0, allow_none=True, hint="use None to repeat forever")
        self.source = source
        self.count = count
        self.reset()

    def reset(self) -> None:
        if getattr(self, "_round", 0) or self._round_number():  # left in a later round
            set_input_round(self, self.source, 0)
        self._round = 0
        self._yielded = False  # whether the current round produced an item
        self._done = self.count == 0

    def async_next(self) -> Any:
        if self._done:
            raise StopIteration
        source = self.source
        while True:
            try:
                item = source.async_next()
            except StopIteration:
                self._next_round()
                continue
            self._yielded = True
            return item

    def _next_round(self) -> None:
        if (self.count is None and not self._yielded) or (
            self.count is not None and self._round + 1 >= self.count
        ):
            self._done = True
            raise StopIteration
        self._round += 1
        self._yielded = False
        set_input_round(self, self.source, self._round)
        reset_pipeline(self.source)

    def __len__(self) -> int:
        if self.count is None:
            raise TypeError("Cycler(count=None) repeats forever and has no length")
        return len(self.source) * self.count

    def state_dict(self) -> dict[str, Any]:
        return {"round": self._round, "yielded": self._yielded, "done": self._done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        last = None if self.count is None else max(self.count - 1, 0)
        self._round = fields.int("round", maximum=last)
        self._yielded = fields.bool("yielded")
        self._done = fields.bool("done")
        set_input_round(self, self.source, self._round)

    def __repr__(self) -> str:
        return f"Cycler(count={self.count!r})"
