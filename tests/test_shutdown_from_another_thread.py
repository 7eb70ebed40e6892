"""``shutdown()`` from another thread while ``next(loader)`` waits on a stuck worker.

It used to wait for that ``next()`` to end, which a stuck worker never lets
happen: a watchdog thread's ``shutdown()`` hung with the training loop. Now
the wait wakes, ``next()`` raises ``LoaderShutDown`` at once, the position is
kept (a wait for the next item is between two items), and ``shutdown()``
returns once the workers are stopped.
"""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest
import torch

import pipeloom._remote_shutdown
from pipeloom import DataLoader
from pipeloom._remote_shutdown import stop_the_step
from pipeloom._steps import StepGate
from pipeloom.compat import DataLoader as CompatLoader
from pipeloom.datapipes import BlockingReader, IterableWrapper, IterDataPipe, NotAvailable
from pipeloom.errors import LoaderShutDown, StateError
from pipeloom.events import Signal
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService

STUCK_AT = [5]  # the item a worker gets stuck on (read by forked workers as they start)
RELEASE = threading.Event()  # ends a stuck worker *thread* when the test is done
STUCK = multiprocessing.get_context("fork").Event()  # set by the worker that got stuck


def stuck(x: int) -> int:
    if x in STUCK_AT:
        STUCK.set()
        RELEASE.wait(20)  # a process worker is killed long before
    return x


@pytest.fixture(autouse=True)
def _release_stuck_threads():
    STUCK_AT[:] = [5]
    RELEASE.clear()
    STUCK.clear()
    yield
    RELEASE.set()


def pipeline(batch: bool):
    pipe = IterableWrapper(range(10)).sharding_filter().map(stuck)
    return pipe.batch(1) if batch else pipe


SERVICES = {
    "threads": (lambda: ThreadReadingService(2), False),
    "classic": (lambda: MultiProcessingReadingService(2, timeout=30), False),
    "economic": (lambda: MultiProcessingReadingService(2, strategy="economic", timeout=30), True),
}


def shut_down_later(loader) -> threading.Thread:
    """``loader.shutdown()`` from a watchdog thread once a worker is stuck (and the
    training loop, which had every item before the stuck one at once, waits for it)."""

    def watchdog():
        assert STUCK.wait(20), "no worker got stuck"
        time.sleep(0.2)
        loader.shutdown()

    thread = threading.Thread(target=watchdog, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(SERVICES))
def test_next_raises_at_once_and_the_state_resumes_at_the_item_it_waited_for(name):
    make_service, batch = SERVICES[name]
    loader = DataLoader(pipeline(batch), make_service())
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    watchdog = shut_down_later(loader)
    started = time.monotonic()
    with pytest.raises(LoaderShutDown, match=r"another thread while next\(loader\) waited for"):
        while True:
            head.append(next(it))
    assert time.monotonic() - started < 10  # not the 20 s the stuck item takes
    RELEASE.set()  # a stuck worker thread cannot be killed: shutdown() waits for it
    watchdog.join(20)
    assert not watchdog.is_alive(), "shutdown() hung"
    state = loader.state_dict()
    STUCK_AT[:] = []
    with DataLoader(pipeline(batch), make_service()) as resumed:
        resumed.load_state_dict(state)
        rest = list(resumed)
    flat = [x[0] if batch else x for x in head + rest]
    assert flat == list(range(10))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "workers", [{"num_workers": 2, "timeout": 30}, {"num_workers": 2, "worker_type": "thread"}]
)
def test_the_compat_loader_wakes_its_waiting_next_too(workers):
    class Stuck(torch.utils.data.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return stuck(i)

    loader = CompatLoader(Stuck(), batch_size=2, **workers)
    it = iter(loader)
    next(it)
    watchdog = shut_down_later(loader)
    with pytest.raises(LoaderShutDown, match=r"waited for batch \d of the epoch"):
        while True:
            next(it)
    RELEASE.set()
    watchdog.join(20)
    assert not watchdog.is_alive(), "shutdown() hung"
    with pytest.raises(RuntimeError, match="no longer valid: shutdown"):
        next(it)
    assert loader.state_dict()["epoch"]["delivered"] in (1, 2)


@pytest.mark.timeout(30)
def test_a_next_running_code_in_its_own_thread_is_not_waited_for_past_a_bound(monkeypatch):
    monkeypatch.setattr(pipeloom._remote_shutdown, "STEP_END_WAIT_S", 0.2)
    STUCK_AT[:] = [2]
    loader = DataLoader(pipeline(False))  # in-process: the stuck map runs in next()'s thread
    it = iter(loader)
    watchdog = threading.Thread(target=lambda: (STUCK.wait(10), loader.shutdown()))
    watchdog.start()
    threading.Timer(0.6, RELEASE.set).start()  # the stuck code returns at last
    assert [next(it), next(it), next(it)] == [0, 1, 2]  # the step in progress ends normally
    watchdog.join(0.1)
    assert not watchdog.is_alive(), "shutdown() waited for the step past its bound"
    with pytest.raises(RuntimeError, match="no longer valid: shutdown"):
        next(it)
    with pytest.raises(StateError, match="without waiting for an item"):
        loader.state_dict()


def test_a_shutdown_with_no_next_in_progress_is_unchanged():
    STUCK_AT[:] = []
    loader = DataLoader(pipeline(False), ThreadReadingService(2))
    it = iter(loader)
    assert [next(it) for _ in range(2)] == [0, 1]
    thread = threading.Thread(target=loader.shutdown)
    thread.start()
    thread.join(10)
    assert loader.state_dict()["delivered"] == 2


class Never(IterDataPipe):
    """A source whose next item never comes; ``asked`` is set once a reader asked."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.signal = Signal()

    def readiness_sources(self):
        return [self.signal]

    def async_next(self):
        self.asked.set()
        raise NotAvailable


def wait_for_an_item(gate: StepGate, source: Never, raised: list) -> threading.Thread:
    """A thread that holds the loader between two steps (a ``state_dict()``, a replay
    inside ``iter()``) and waits there for an item that never comes."""

    def hold_and_wait():
        with gate.between():
            try:
                BlockingReader(source, between_items=True).next(timeout=3)
            except (LoaderShutDown, TimeoutError) as error:
                raised.append(error)

    thread = threading.Thread(target=hold_and_wait, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(30)
def test_the_wake_up_reaches_a_third_thread_holding_the_loader(monkeypatch):
    # It went to the thread that stepped last (the training loop, here this
    # one), and shutdown() waited out its bound for the holder instead.
    monkeypatch.setattr(pipeloom._remote_shutdown, "STEP_END_WAIT_S", 1.0)
    gate, source, raised = StepGate(), Never(), []
    gate.stepper = threading.get_ident()  # this thread stepped last
    holder = wait_for_an_item(gate, source, raised)
    assert source.asked.wait(10)
    stopped = stop_the_step(gate, lambda: "item 3 of epoch 0", lambda: {"delivered": 3})
    holder.join(10)
    assert stopped.ended, "shutdown() waited out its bound: the holder was not woken"
    assert stopped.state == {"delivered": 3}  # taken by the woken thread, between two items
    assert [type(error) for error in raised] == [LoaderShutDown]


def test_a_thread_taking_the_loader_while_a_shutdown_waits_is_woken_at_once():
    # e.g. next() in the training loop takes the loader as the woken holder lets go,
    # before shutdown() gets it: its wait for a stuck worker must wake as well
    gate = StepGate()
    with gate.waking(lambda between_items: LoaderShutDown("stopped")), gate.between():
        with pytest.raises(LoaderShutDown, match="stopped"):
            BlockingReader(Never(), between_items=True).next(timeout=3)
    with gate.between():  # once the shutdown is through, a wait is a wait again
        with pytest.raises(TimeoutError):
            BlockingReader(Never(), between_items=True).next(timeout=0.05)


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return map(stuck, range(10))


@pytest.mark.timeout(60)
def test_the_compat_loader_wakes_a_replay_of_an_iterable_dataset():
    # An IterableDataset resumes by re-reading what was delivered, inside the first
    # next(), which holds the loader: the wait there is woken too.
    STUCK_AT[:] = []
    with CompatLoader(Stream(), batch_size=1, num_workers=1, timeout=30) as first:
        it = iter(first)
        head = [int(next(it)) for _ in range(7)]
        state = first.state_dict()
    STUCK_AT[:] = [5]
    loader = CompatLoader(Stream(), batch_size=1, num_workers=1, timeout=30)
    loader.load_state_dict(state)

    def watchdog():
        assert STUCK.wait(20), "no worker got stuck"
        loader.shutdown()

    thread = threading.Thread(target=watchdog, daemon=True)
    thread.start()
    started = time.monotonic()
    resumed = iter(loader)  # the batches delivered are left out as they come again
    with pytest.raises(LoaderShutDown, match=r"waited for batch 7 of the epoch"):
        next(resumed)
    assert time.monotonic() - started < 10  # not the 20 s the stuck item takes
    thread.join(20)
    assert not thread.is_alive(), "shutdown() hung"
    assert head == list(range(7))
    assert loader.state_dict()["epoch"]["outputs"] == [7]  # resumes at the batch it waited for
