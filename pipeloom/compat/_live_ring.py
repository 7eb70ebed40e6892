"""Sampler outputs drawn as the epoch goes, handed to worker processes in shared memory.

A region of the plan board's shared buffer: a control block and ``slots``
slots of ``slot_size`` bytes. The main process writes output ``p`` (pickled)
into slot ``p % slots`` -- only once every output ``slots`` places before it
was delivered, so nothing unread is overwritten -- then raises ``PUBLISHED``
past it and writes the board's eventfd, which wakes the workers waiting for
an output (each worker's selector watches it, edge-triggered: nobody reads
it). ``END`` says where the sampler ran out; ``STOPPED`` that the run of
that serial is being stopped, so its readers end now.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from .._shared_memory import memory_fence
from ..errors import NotAvailable

__all__ = ["LiveRing", "RingEntries", "ring_geometry"]

_SERIAL, _PUBLISHED, _END, _STOPPED = range(4)
_CONTROL_BYTES = 64
_HEADER_BYTES = 16  # a slot's position and payload size
_MIN_SLOT = 16 * 1024


def ring_geometry(ahead: int, first_outputs: list[Any]) -> tuple[int, int]:
    """``(slots, slot_size)`` for ``ahead`` outputs in flight, sized from the first ones.

    >>> ring_geometry(4, [[1, 2, 3]])
    (10, 16384)
    """
    largest = max((len(pickle.dumps(x, protocol=5)) for x in first_outputs), default=0)
    slot_size = max(_MIN_SLOT, 8 * (largest + _HEADER_BYTES))
    slot_size = -(-slot_size // 4096) * 4096
    return 2 * max(1, ahead) + 2, slot_size


def ring_bytes(slots: int, slot_size: int) -> int:
    return _CONTROL_BYTES + slots * slot_size


class LiveRing:
    """The ring in ``view`` (a uint8 region of shared memory); both sides use it."""

    def __init__(self, view: np.ndarray, slots: int, slot_size: int) -> None:
        self.slots, self.slot_size = slots, slot_size
        self._control = view[:_CONTROL_BYTES].view(np.int64)
        self._data = view[_CONTROL_BYTES : ring_bytes(slots, slot_size)]

    # -- the main process -----------------------------------------------------------
    def start(self, serial: int, first: int) -> None:
        control = self._control
        control[_PUBLISHED], control[_END], control[_STOPPED] = first, -1, 0
        memory_fence()
        control[_SERIAL] = serial

    @property
    def published(self) -> int:
        return int(self._control[_PUBLISHED])

    def put(self, position: int, entry: Any) -> None:
        """Write output ``position`` (the next one) and publish it."""
        payload = pickle.dumps(entry, protocol=5)
        room = self.slot_size - _HEADER_BYTES
        if len(payload) > room:
            raise ValueError(
                f"sampler output {position} pickles to {len(payload)} bytes; outputs of a "
                f"sampler drawn as the epoch goes (no __len__, or endless) may take at most "
                f"{room} bytes, 8 times the first ones' size: keep its batches of similar "
                f"size, or give the sampler a __len__ so that its epoch is drawn at iter()"
            )
        start = (position % self.slots) * self.slot_size
        slot = self._data[start : start + self.slot_size]
        slot[_HEADER_BYTES : _HEADER_BYTES + len(payload)] = np.frombuffer(payload, np.uint8)
        header = slot[:_HEADER_BYTES].view(np.int64)
        header[0], header[1] = position, len(payload)
        memory_fence()
        self._control[_PUBLISHED] = position + 1

    def finish(self, end: int) -> None:
        self._control[_END] = end

    def stop(self) -> None:
        self._control[_STOPPED] = self._control[_SERIAL]

    # -- a worker process -----------------------------------------------------------
    def take(self, position: int, serial: int) -> Any:
        control = self._control
        if control[_SERIAL] != serial or control[_STOPPED] == serial:
            raise StopIteration
        if position < control[_PUBLISHED]:
            memory_fence()
            start = (position % self.slots) * self.slot_size
            slot = self._data[start : start + self.slot_size]
            header = slot[:_HEADER_BYTES].view(np.int64)
            if header[0] != position:
                raise RuntimeError(
                    f"sampler output {position} was overwritten before this worker read it "
                    f"(a pipeloom bug: please report it)"
                )
            return pickle.loads(slot[_HEADER_BYTES : _HEADER_BYTES + int(header[1])].tobytes())
        end = control[_END]
        if 0 <= end <= position:
            raise StopIteration
        raise NotAvailable


class RingEntries:
    """A worker's view of a live plan: entries from position ``first`` of run ``serial``."""

    is_live = True

    def __init__(self, ring: LiveRing, first: int, serial: int) -> None:
        self._ring, self._first, self._serial = ring, first, serial

    def take(self, index: int) -> Any:
        return self._ring.take(self._first + index, self._serial)

    def __len__(self) -> int:
        return max(0, self._ring.published - self._first)

    def __getitem__(self, index: int) -> Any:
        try:
            return self.take(index)
        except (StopIteration, NotAvailable):
            raise IndexError(index) from None

    def __repr__(self) -> str:
        return f"RingEntries(first={self._first}, serial={self._serial})"
