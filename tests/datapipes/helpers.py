"""Test-only blocks: an upstream that is sometimes not ready, and an old-style block."""

from __future__ import annotations

import random
import threading

from pipeloom.datapipes import (
    IterDataPipe,
    current_position,
    item_stamp,
    reset_pipeline,
    set_item_stamp,
)
from pipeloom.errors import NotAvailable
from pipeloom.events import Signal


class Flaky(IterDataPipe):
    """Yields ``items`` but raises NotAvailable before some of them (seeded).

    A background timer fires the readiness signal, so blocking readers must
    wait on events to make progress.
    """

    def __init__(self, items, *, seed: int = 0, p_unavailable: float = 0.5) -> None:
        self.items = list(items)
        self.seed = seed
        self.p_unavailable = p_unavailable
        self.signal = Signal()
        self.reset()

    def reset(self) -> None:
        self._rng = random.Random(self.seed)
        self._index = 0
        self._ready = False

    def readiness_sources(self):
        return [self.signal]

    def async_next(self):
        if self._index >= len(self.items):
            raise StopIteration
        if not self._ready and self._rng.random() < self.p_unavailable:
            self._ready = True
            threading.Timer(0.001, self.signal.fire).start()
            raise NotAvailable
        self._ready = False
        item = self.items[self._index]
        self._index += 1
        return item

    def state_dict(self):
        return {"index": self._index}

    def load_state_dict(self, state):
        self._index = state["index"]


class OldStyleDouble(IterDataPipe):
    """An old-style block: a plain generator over its input."""

    inputs = ("source",)

    def __init__(self, source) -> None:
        self.source = source

    def __iter__(self):
        for item in self.source:
            yield item * 2


class Stutter(IterDataPipe):
    """Test upstream: before some items (seeded choice) it raises NotAvailable once."""

    inputs = ("source",)

    def __init__(self, source, seed=0, rate=0.5):
        self.source, self.seed, self.rate = source, seed, rate
        self.signal = Signal()
        self.reset()

    def reset(self):
        self._rng, self._owed = random.Random(self.seed), False

    def async_next(self):
        if not self._owed and self._rng.random() < self.rate:
            self._owed = True
            self.signal.fire()
            raise NotAvailable
        self._owed = False
        return self.source.async_next()

    def readiness_sources(self):
        return (self.signal,)

    def state_dict(self):
        return {}


def drive(pipe):
    """Call async_next until the end, retrying on NotAvailable; count the retries."""
    reset_pipeline(pipe)
    items, stalls = [], 0
    while True:
        try:
            items.append(pipe.async_next())
        except NotAvailable:
            stalls += 1
        except StopIteration:
            return items, stalls


def drain_retrying(pipe):
    reset_pipeline(pipe)
    out = []
    while True:
        try:
            out.append(pipe.async_next())
        except NotAvailable:
            continue
        except StopIteration:
            return out


class WithPosition(IterDataPipe):
    inputs = ("source",)

    def __init__(self, source):
        self.source = source

    def async_next(self):
        return self.source.async_next(), current_position()

    def state_dict(self):
        return {}


def raise_in_source(i):
    raise ValueError(f"bad item {i}")


class Twice(IterDataPipe):
    """The docs' Twice: two outputs of each input, keys ``(p, 0)`` and ``(p, 1)``."""

    inputs = ("source",)

    def __init__(self, source):
        self.source = source
        self.reset()

    def reset(self):
        self._item, self._stamp, self._next = None, None, 2

    def async_next(self):
        if self._next == 2:
            self._item = self.source.async_next()
            self._stamp, self._next = item_stamp(), 0
        output, self._next = self._next, self._next + 1
        set_item_stamp(self._stamp, output=output)
        return self._item

    def state_dict(self):
        return {"item": self._item, "stamp": self._stamp, "next": self._next}

    def load_state_dict(self, state):
        self._item, self._stamp, self._next = state["item"], state["stamp"], state["next"]
