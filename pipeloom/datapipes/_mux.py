"""Interleaving streams round-robin."""

from __future__ import annotations

from typing import Any

from ._base import IterDataPipe
from ._context import current_stamp, restore_stamp
from ._zip import check_inputs

__all__ = ["Multiplexer"]


class Multiplexer(IterDataPipe):
    """Yield one item of each stream in turn (functional: ``mux``).

    As torchdata's ``mux``: rounds of one item per stream; when any stream is
    exhausted the whole output ends, and an incomplete last round is dropped.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> a, b = IterableWrapper(range(3)), IterableWrapper(range(10, 15))
        >>> list(Multiplexer(a, b))
        [0, 10, 1, 11, 2, 12]
    """

    inputs = ("datapipes",)

    def __init__(self, *datapipes: IterDataPipe) -> None:
        self.datapipes = check_inputs("mux", datapipes, IterDataPipe)
        self.reset()

    def reset(self) -> None:
        self._filling: list[tuple[Any, Any]] = []  # (item, stamp) of the round being read
        self._ready: list[tuple[Any, Any]] = []  # the complete round being emitted
        self._emitted = 0
        self._done = False

    def async_next(self) -> Any:
        ready = self._ready
        emitted = self._emitted
        if emitted >= len(ready):
            ready = self._read_round()
            emitted = 0
        self._emitted = emitted + 1
        item, stamp = ready[emitted]
        restore_stamp(stamp)
        return item

    def _read_round(self) -> list[tuple[Any, Any]]:
        if self._done:
            raise StopIteration
        filling, datapipes = self._filling, self.datapipes
        try:
            for dp in datapipes[len(filling) :]:
                filling.append((dp.async_next(), current_stamp()))
        except StopIteration:
            self._done = True
            filling.clear()
            raise
        self._ready, self._filling, self._emitted = filling, [], 0
        return filling

    def __len__(self) -> int:
        return min(len(dp) for dp in self.datapipes) * len(self.datapipes)

    def state_dict(self) -> dict[str, Any]:
        return {
            "filling": list(self._filling),
            "ready": list(self._ready),
            "emitted": self._emitted,
            "done": self._done,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._filling = [tuple(x) for x in state["filling"]]
        self._ready = [tuple(x) for x in state["ready"]]
        self._emitted = int(state["emitted"])
        self._done = bool(state["done"])

    def __repr__(self) -> str:
        return "Multiplexer()"
