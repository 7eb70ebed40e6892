"""Checkpoints at preemption: a signal handler that saves the state, signals to the workers.

A handler runs in the main thread between any two lines of whatever it was
doing, pipeloom's own code included. ``handler_at_every_line`` stands in for
a signal arriving at each of them in turn (``sys.settrace``), deterministically.
Whatever it interrupts, ``state_dict()`` there gives an exact state or raises
``StateError``; it never waits for itself.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, item_rng
from pipeloom.errors import StateError


def noisy(x):
    return x * 10 + int(item_rng().integers(10))


def build():
    return IterableWrapper(range(30)).shuffle(buffer_size=8).sharding_filter().map(noisy).batch(4)


def handler_at_every_line(run: Callable[[], None], handler: Callable[[], None]) -> None:
    """Run ``run`` in a thread, calling ``handler`` at each line of pipeloom's code it runs.

    A thread, so a handler that waits for itself fails the test in seconds.
    """
    failure: list[BaseException] = []

    def trace(frame: FrameType, event: str, _arg: Any) -> Any:
        if event == "call":
            return trace if "/pipeloom/" in frame.f_code.co_filename else None
        if event == "line":
            sys.settrace(None)  # the handler itself runs untraced, as Python runs one
            try:
                handler()
            finally:
                sys.settrace(trace)
        return trace

    def traced() -> None:
        sys.settrace(trace)
        try:
            run()
        except BaseException as error:  # noqa: BLE001 - reported by the test thread
            failure.append(error)
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=traced, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "a state_dict() called from a signal handler waits for itself"
    if failure:
        raise failure[0]


def test_a_handler_that_saves_the_state_anywhere_gets_an_exact_state_or_a_clear_refusal():
    uninterrupted = list(DataLoader(build(), seed=3))
    loader = DataLoader(build(), seed=3)
    received: list = []
    saved: list[tuple[int, dict]] = []  # (items the loop had received, the state)
    refused: list[str] = []

    def on_preemption() -> None:  # what a SIGTERM handler that checkpoints does
        try:
            saved.append((len(received), loader.state_dict()))
        except StateError as error:
            refused.append(str(error))

    def training_loop() -> None:
        iterator = iter(loader)
        for _ in range(3):
            received.append(next(iterator))
            loader.state_dict()  # the loop's own periodic checkpoint
        received.extend(iterator)

    handler_at_every_line(training_loop, on_preemption)
    assert received == uninterrupted
    assert refused and all("from inside a step of this loader" in why for why in refused)
    assert len(saved) > 10  # between two steps: in iter(), state_dict(), before next()
    for had, state in saved:
        assert state["delivered"] in (had, had + 1)  # +1: taken as next() returned its item
        resumed = DataLoader(build(), seed=99)
        resumed.load_state_dict(state)
        assert list(resumed) == uninterrupted[state["delivered"] :], (had, state["delivered"])
