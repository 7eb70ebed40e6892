"""Checkpoints at preemption: a signal handler that saves the state, signals to the workers.

A handler runs in the main thread between any two lines of whatever it was
doing, pipeloom's own code included. ``handler_at_every_line`` stands in for
a signal arriving at each of them in turn (``sys.settrace``), deterministically.
Whatever it interrupts, ``state_dict()`` there gives an exact state or raises
``StateError``; it never waits for itself.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pytest

from pipeloom import DataLoader, compat
from pipeloom.datapipes import IterableWrapper, item_rng
from pipeloom.errors import StateError
from pipeloom.events import Waiter
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService


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
        if state["epoch"] == 1:  # taken as the epoch ended: the next one's start
            assert (had, state["delivered"]) == (len(uninterrupted), 0)
            continue
        assert state["delivered"] == had  # never the item next() has yet to return
        resumed = DataLoader(build(), seed=99)
        resumed.load_state_dict(state)
        assert list(resumed) == uninterrupted[state["delivered"] :], (had, state["delivered"])


class SignalAsReleased:
    """A loader's step lock that sends this process SIGUSR1 right after the step that
    ``armed`` it releases it: the handler runs once ``next()`` has counted its item and
    before it returns it, where a real signal can land too."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.armed = False

    def acquire(self) -> bool:
        return self.lock.acquire()

    def release(self) -> None:
        self.lock.release()
        if self.armed:
            self.armed = False
            signal.raise_signal(signal.SIGUSR1)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _is_owned(self) -> bool:
        return self.lock._is_owned()


def loaders() -> Iterator[tuple[str, Any, list]]:
    yield "DataLoader", DataLoader(build(), seed=3), list(DataLoader(build(), seed=3))
    batches = [b.tolist() for b in compat.DataLoader(list(range(30)), batch_size=4)]
    yield "compat", compat.DataLoader(list(range(30)), batch_size=4), batches


def as_lists(batches) -> list:
    return [b.tolist() if hasattr(b, "tolist") else b for b in batches]


@pytest.fixture
def on_sigusr1():
    """Install a SIGUSR1 handler for the test; the previous one afterwards."""
    previous = signal.getsignal(signal.SIGUSR1)
    yield lambda handler: signal.signal(signal.SIGUSR1, lambda signum, frame: handler())
    signal.signal(signal.SIGUSR1, previous)


@pytest.mark.parametrize("name", ["DataLoader", "compat"])
def test_a_handler_that_runs_as_next_returns_its_item_cannot_save_that_item_as_delivered(
    name, on_sigusr1
):
    _, loader, uninterrupted = next(item for item in loaders() if item[0] == name)
    lock = loader._steps.lock = SignalAsReleased(loader._steps.lock)
    outcome: list = []

    def save_and_exit() -> None:  # the usual preemption handler
        try:
            outcome.append(loader.state_dict())
        except StateError as error:
            outcome.append(error)
        raise SystemExit(0)

    on_sigusr1(save_and_exit)
    iterator = iter(loader)
    received = as_lists(next(iterator) for _ in range(2))
    lock.armed = True
    with pytest.raises(SystemExit):
        received.append(next(iterator))  # counted, then the handler exits: never received
    assert received == uninterrupted[:2]
    assert isinstance(outcome[0], StateError), "saved a state that counts batch 2, never received"
    assert "from inside a step of this loader" in str(outcome[0])


@pytest.mark.parametrize("name", ["DataLoader", "compat"])
def test_ctrl_c_as_next_returns_its_item_leaves_no_inexact_state_and_no_silent_gap(
    name, on_sigusr1
):
    _, loader, uninterrupted = next(item for item in loaders() if item[0] == name)
    lock = loader._steps.lock = SignalAsReleased(loader._steps.lock)
    on_sigusr1(_raise_keyboard_interrupt)
    iterator = iter(loader)
    received = as_lists(next(iterator) for _ in range(2))
    lock.armed = True
    with pytest.raises(KeyboardInterrupt):
        received.append(next(iterator))  # the Jupyter interrupt: batch 2 never arrives
    assert received == uninterrupted[:2]
    with pytest.raises(StateError, match="KeyboardInterrupt escaped next"):
        loader.state_dict()  # not a state that counts batch 2 as delivered
    with pytest.raises(RuntimeError, match="KeyboardInterrupt"):
        next(iterator)  # not batch 3, as if batch 2 had been received


def _raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


def worker_pid(x):
    return x, os.getpid()


@pytest.mark.parametrize(("strategy", "start"), [("classic", "fork"), ("economic", "spawn")])
def test_workers_leave_the_signals_the_main_process_handles_to_it(strategy, start, on_sigusr1):
    """SLURM and ``kill -- -PGID`` signal every process of the job: a forked worker
    inherits the training loop's Python handler, which there would save a stale
    fork-time copy of the loader (over the real checkpoint) and exit mid-item; a
    spawned one would die of the signal's default action."""

    def save_and_exit() -> None:
        raise SystemExit(0)

    on_sigusr1(save_and_exit)
    service = MultiProcessingReadingService(2, start_method=start, strategy=strategy)
    pipe = IterableWrapper(range(60)).sharding_filter().map(worker_pid).batch(2)
    with DataLoader(pipe, service, seed=0) as loader:
        iterator = iter(loader)
        first = [item for _ in range(4) for item in next(iterator)]
        workers = {pid for _, pid in first} - {os.getpid()}
        assert workers
        for pid in workers:  # as the scheduler does; each has items left to make
            os.kill(pid, signal.SIGUSR1)
        rest = [item for batch in iterator for item in batch]  # no worker exited
    assert sorted(x for x, _ in first + rest) == list(range(60))


def test_ctrl_c_while_next_waits_for_a_worker_shows_one_keyboard_interrupt(monkeypatch):
    """A terminal's Ctrl-C reaches every process of the group; the workers leave it to
    the main process, whose traceback is that one KeyboardInterrupt, not one raised
    "during handling of" pipeloom's internal NotAvailable."""
    never = threading.Event()

    def slow(x):
        never.wait(timeout=0.2)  # the main thread waits for this item
        return x

    def ctrl_c(*_args: object) -> bool:
        raise KeyboardInterrupt

    pipe = IterableWrapper(range(2)).sharding_filter().map(slow)
    with DataLoader(pipe, ThreadReadingService(1)) as loader:
        iterator = iter(loader)
        monkeypatch.setattr(Waiter, "wait", ctrl_c)  # Ctrl-C lands while next() waits
        with pytest.raises(KeyboardInterrupt) as interrupt:
            next(iterator)
        monkeypatch.undo()
    assert interrupt.value.__context__ is None, repr(interrupt.value.__context__)


def test_a_handler_that_shuts_down_while_next_holds_a_queue_lock_does_not_wait_for_itself():
    """``loader.shutdown()`` in a SIGTERM handler, landing while the interrupted ``next()``
    holds a worker queue's lock: closing that queue (and joining the worker thread that
    waits for it) must not wait for that lock; the workers stop as the step ends."""
    before = set(threading.enumerate())
    loader = DataLoader(build(), ThreadReadingService(2))
    landed: list[bool] = []

    def trace(frame: FrameType, event: str, _arg: Any) -> Any:
        caller = frame.f_back
        if (
            event == "call"
            and not landed
            and frame.f_code.co_name == "notify_all"  # the queue's lock is held here
            and caller is not None
            and caller.f_code.co_qualname == "ThreadQueue.get"
        ):
            landed.append(True)
            sys.settrace(None)
            loader.shutdown()  # what the handler does, then sys.exit()
            raise SystemExit(0)
        return None

    def training_loop() -> None:
        iterator = iter(loader)
        next(iterator)
        sys.settrace(trace)
        with pytest.raises(SystemExit):
            list(iterator)

    finished = threading.Thread(target=training_loop, daemon=True)
    finished.start()
    finished.join(timeout=10)
    assert landed and not finished.is_alive(), "shutdown() from the handler waits for itself"
    assert set(threading.enumerate()) - before == set()  # its worker threads were joined


def test_a_state_dict_that_interrupts_the_loader_s_own_state_dict_is_refused_saying_so():
    """A handler's ``state_dict()`` landing while the main thread is in ``state_dict()``
    (not in ``next()``): the refusal names every call it may have interrupted."""
    loader = DataLoader(IterableWrapper(range(5)))
    it = iter(loader)
    next(it)
    refused = []
    taking = loader.reading_service.state_dict

    def interrupted_by_a_handler():
        try:
            loader.state_dict()
        except StateError as error:
            refused.append(str(error))
        return taking()

    loader.reading_service.state_dict = interrupted_by_a_handler
    assert loader.state_dict()["delivered"] == 1
    assert len(refused) == 1
    assert "interrupted this loader's next(), state_dict()" in refused[0]
    assert "part-way through one of them" in refused[0]
