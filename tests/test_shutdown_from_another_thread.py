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
from pipeloom.compat import DataLoader as CompatLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.errors import LoaderShutDown, StateError
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
