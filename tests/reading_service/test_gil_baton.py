"""The worker threads' GIL baton: when it is on, that it is held by one worker at a time,
that it never changes the output, and that errors and early stops release it."""

from __future__ import annotations

import collections
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import InProcessReadingService, ThreadReadingService
from pipeloom.reading_service.workers import baton as baton_module
from pipeloom.reading_service.workers.baton import (
    EVIDENCE,
    FIRST_HOLD_OFF,
    MAX_HOLD_OFF,
    RECHECK,
    BatonPolicy,
    GilBaton,
    Window,
)
from tests.reading_service import pipelines

BUSY = Window(wall=0.01, cpu=0.01, puts=10, waited=False)  # one core, 1000 outputs/s
GIL_FREE = Window(wall=0.01, cpu=0.02, puts=10, waited=False)  # two cores
WAITING = Window(wall=0.01, cpu=0.0005, puts=10, waited=False)  # sleeps, I/O
BEHIND_CONSUMER = Window(wall=0.01, cpu=0.0005, puts=2, waited=True)


@pytest.fixture(autouse=True)
def _with_a_gil(monkeypatch):
    """These tests judge the baton where there is a GIL, also on a free-threaded build."""
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: True, raising=False)


def on_window(puts: int = 10, held_cpu: float = 0.01) -> Window:
    return Window(wall=0.01, cpu=0.01, puts=puts, waited=False, held_wall=0.01, held_cpu=held_cpu)


def tried(policy: BatonPolicy, window: Window = BUSY) -> None:
    """Feed busy windows until the policy tries the baton (EVIDENCE of them at most)."""
    for _ in range(EVIDENCE):
        if policy.observe(window):
            return
    raise AssertionError(f"no try after {EVIDENCE} busy windows")


# -- the policy: when the baton is on (windows in, on/off out; no clocks) -----------------------


def test_busy_workers_get_the_baton_after_evidence_and_keep_it_when_not_slower():
    policy = BatonPolicy("auto")
    for _ in range(EVIDENCE - 1):
        assert not policy.observe(BUSY)
    assert policy.observe(BUSY)  # a try
    assert policy.observe(on_window(puts=10))  # as fast as without: kept
    stats = policy.statistics()
    assert (stats.on, stats.switched_on, stats.switched_off) == (True, 1, 0)


def test_waiting_workers_never_get_the_baton():
    policy = BatonPolicy("auto")
    for _ in range(10 * EVIDENCE):
        assert not policy.observe(WAITING)
    assert policy.statistics().switched_on == 0


def test_gil_releasing_work_loses_the_try_and_waits_longer_each_time():
    policy = BatonPolicy("auto")
    tried(policy, GIL_FREE)
    assert not policy.observe(on_window(puts=5))  # half the outputs with the baton: off
    for _ in range(FIRST_HOLD_OFF):  # holding off
        assert not policy.observe(GIL_FREE)
    assert policy.observe(GIL_FREE)  # the second try
    assert not policy.observe(on_window(puts=5))
    assert policy.hold_off == 2 * FIRST_HOLD_OFF
    assert policy.statistics().switched_off == 2


def test_the_hold_off_stops_doubling_at_its_cap():
    policy = BatonPolicy("auto")
    for _ in range(20):
        policy.hold_off = 0
        tried(policy, GIL_FREE)
        policy.observe(on_window(puts=1))
    assert policy.hold_off == MAX_HOLD_OFF


def test_a_slower_try_is_dropped_even_when_it_costs_less_cpu_per_output():
    # Decoding that releases the GIL: 1.7 cores for 400 outputs/s side by side; with the
    # baton one core for 300 (less CPU per output, but the job runs slower): off again.
    side_by_side = Window(wall=0.01, cpu=0.017, puts=4, waited=False)
    policy = BatonPolicy("auto")
    tried(policy, side_by_side)
    assert not policy.observe(on_window(puts=3))
    assert policy.statistics().switched_off == 1


def test_holders_that_block_while_holding_turn_it_off():
    policy = BatonPolicy("auto")
    tried(policy)
    assert not policy.observe(on_window(held_cpu=0.001))  # held 10 ms, computed 1 ms
    assert policy.statistics().blocked_holders == 1


def test_a_kept_baton_is_measured_again_without_it_ever_less_often():
    policy = BatonPolicy("auto")
    tried(policy)
    policy.observe(on_window())  # the try is kept
    for wait in (RECHECK, 2 * RECHECK):
        for _ in range(wait - 1):
            assert policy.observe(on_window())
        assert not policy.observe(on_window())  # one window without it
        assert policy.observe(BUSY)  # still busy: a new try at once, against that window
        assert policy.observe(on_window())  # as fast: kept, the next re-measure waits twice as long
    for _ in range(4 * RECHECK - 1):
        assert policy.observe(on_window())
    assert not policy.observe(on_window())
    assert policy.observe(BUSY)
    assert not policy.observe(on_window(puts=1))  # now much slower with it: off
    assert policy.recheck == RECHECK


def test_windows_paced_by_the_consumer_are_not_judged():
    policy = BatonPolicy("auto")
    tried(policy)
    policy.observe(on_window())
    for _ in range(5):
        assert policy.observe(BEHIND_CONSUMER)  # the workers waited for the consumer
    incomplete = Window(wall=0.01, cpu=0.0, puts=1, waited=False, complete=False)
    assert policy.observe(incomplete)
    assert policy.statistics().switched_off == 0


@pytest.mark.parametrize("mode", ["on", "off"])
def test_forced_modes_ignore_the_measurements(mode):
    policy = BatonPolicy(mode)
    for window in [BUSY, GIL_FREE, WAITING, on_window(held_cpu=0.0)] * EVIDENCE:
        assert policy.observe(window) is (mode == "on")


# -- the baton between threads ---------------------------------------------------------------


class _NotedTurns(collections.deque):
    """The baton's queue of waiting workers, noting each arrival (no polling in tests)."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = threading.Semaphore(0)

    def append(self, turn) -> None:
        super().append(turn)
        self.arrived.release()


def test_one_worker_holds_the_baton_at_a_time_and_it_goes_round():
    baton = GilBaton(BatonPolicy("on"))
    inside, most, lock = [0], [0], threading.Lock()

    def worker() -> None:
        seat = baton.join()
        for _ in range(200):
            baton.take(seat)
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            sum(range(200))
            with lock:
                inside[0] -= 1
            baton.give(seat)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert most[0] == 1


def test_give_hands_the_baton_to_the_waiting_worker_and_close_releases_the_rest():
    baton = GilBaton(BatonPolicy("on"))
    baton._turns = turns = _NotedTurns()  # noqa: SLF001 - observe arrivals
    holder = baton.join()
    baton.take(holder)
    got: dict[str, bool] = {}

    def wait_for_it(name: str) -> None:
        seat = baton.join()
        baton.take(seat)
        got[name] = seat.held

    first = threading.Thread(target=wait_for_it, args=("first",))
    first.start()
    assert turns.arrived.acquire(timeout=10)
    baton.give(holder)  # straight to the waiting worker
    first.join(timeout=10)
    assert got == {"first": True}
    second = threading.Thread(target=wait_for_it, args=("second",))
    second.start()
    assert turns.arrived.acquire(timeout=10)
    baton.close()  # the first never gives it back: closing lets the second go without it
    second.join(timeout=10)
    assert got == {"first": True, "second": False}
    late = baton.join()
    baton.take(late)  # closed: at once
    assert not late.held


def test_switching_off_lets_the_waiting_workers_run_without_it():
    policy = BatonPolicy("on")
    baton = GilBaton(policy)
    baton._turns = turns = _NotedTurns()  # noqa: SLF001
    holder = baton.join()
    baton.take(holder)
    got = []

    def wait_for_it() -> None:
        seat = baton.join()
        baton.take(seat)
        got.append(seat.held)

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    assert turns.arrived.acquire(timeout=10)
    policy.on = False
    baton.give(holder)  # off now: freed, the waiter goes on without it
    waiter.join(timeout=10)
    assert got == [False]


# -- through the loader -------------------------------------------------------------------


@settings(max_examples=10, deadline=None)
@given(
    threads=st.integers(2, 4),
    seed=st.integers(0, 2**16),
    n=st.integers(0, 60),
    mode=st.sampled_from(["on", "auto"]),
)
def test_output_with_the_baton_equals_in_process(threads, seed, n, mode):
    reference = DataLoader(pipelines.augmented(n, batch=3), InProcessReadingService(), seed=seed)
    expected = [list(reference), list(reference)]  # two epochs
    service = ThreadReadingService(threads, gil_baton=mode)
    with DataLoader(pipelines.augmented(n, batch=3), service, seed=seed) as loader:
        assert [list(loader), list(loader)] == expected


def test_resume_with_the_baton_on_yields_the_rest():
    def pipe():
        return IterableWrapper(range(50)).sharding_filter().map(lambda x: x * 3).batch(4)

    expected = list(DataLoader(pipe(), seed=0))
    with DataLoader(pipe(), ThreadReadingService(3, gil_baton="on"), seed=0) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(5)]
        state = loader.state_dict()
    with DataLoader(pipe(), ThreadReadingService(3, gil_baton="on"), seed=0) as loader:
        loader.load_state_dict(state)
        assert head + list(loader) == expected


def _worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("pipeloom-worker-")]


def test_a_worker_raising_while_holding_the_baton_releases_it():
    raised = []

    def explode(x):
        if x == 13 and not raised:  # the first epoch only
            raised.append(x)
            raise ValueError("bad item 13")
        return x

    pipe = IterableWrapper(range(60)).sharding_filter().map(explode).batch(2)
    with DataLoader(pipe, ThreadReadingService(4, gil_baton="on"), seed=0) as loader:
        seen = []
        with pytest.raises(ValueError, match="bad item 13"):
            for batch in loader:
                seen.append(batch)
        assert seen == [[2 * i, 2 * i + 1] for i in range(6)]  # everything before it
        assert len(list(loader)) == 30  # the next epoch runs: no worker is stuck on the baton
    assert _worker_threads() == []


def test_a_base_exception_in_a_holder_still_gives_the_baton(monkeypatch):
    from pipeloom.reading_service.workers.thread import WorkerThread

    class Stop(BaseException):
        pass

    def stop(x):
        raise Stop

    raised = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_type))
    baton = GilBaton(BatonPolicy("on"))
    worker = WorkerThread(
        IterableWrapper([1]).map(stop),
        index=0,
        count=1,
        seed=0,
        capacity=4,
        epoch=0,
        resume=None,
        baton=baton,
    )
    worker.start()
    worker.thread.join(timeout=10)
    assert raised == [Stop]
    seat = baton.join()
    baton.take(seat)  # free: the dead holder gave it back
    assert seat.held
    worker.close()


def test_stopping_early_with_the_baton_on_ends_every_thread():
    pipe = IterableWrapper(range(10_000)).sharding_filter().map(lambda x: x + 1).batch(4)
    loader = DataLoader(pipe, ThreadReadingService(4, gil_baton="on"), seed=0)
    for index, _ in enumerate(loader):
        if index == 3:
            break
    assert next(iter(loader)) == [1, 2, 3, 4]  # a new epoch after an abandoned one
    loader.shutdown()
    assert _worker_threads() == []


def _run_gil_bound(monkeypatch, cpu) -> baton_module.BatonStatistics:
    """A long pure-Python epoch in "auto" mode, with every window closed at the next put."""
    monkeypatch.setattr(baton_module, "WINDOW_S", 0.0)
    monkeypatch.setattr(baton_module, "_cpu", cpu)

    def pipe():
        return IterableWrapper(range(600)).sharding_filter().map(lambda x: x * 2).batch(2)

    service = ThreadReadingService(2, gil_baton="auto")
    with DataLoader(pipe(), service, seed=0) as loader:
        assert list(loader) == list(DataLoader(pipe(), seed=0))
        return service._runner.pool.baton_statistics()  # noqa: SLF001


def test_auto_tries_the_baton_when_the_workers_compute(monkeypatch):
    import time

    # Each worker thread reads as computing all the time (1 core each, whatever the machine).
    stats = _run_gil_bound(monkeypatch, lambda clock: time.monotonic())
    assert stats.windows > EVIDENCE and stats.switched_on >= 1


def test_auto_leaves_the_baton_off_when_the_workers_wait(monkeypatch):
    stats = _run_gil_bound(monkeypatch, lambda clock: 0.0)  # no CPU at all: they wait
    assert stats.switched_on == 0 and stats.hand_overs == 0


def test_gil_baton_is_checked_with_a_hint(monkeypatch):
    expected = r"gil_baton must be one of 'auto', 'on', 'off', got 'yes'; use 'auto'"
    with pytest.raises(ValueError, match=expected):
        ThreadReadingService(2, gil_baton="yes")
    monkeypatch.setenv("PIPELOOM_GIL_BATON", "always")
    with pytest.raises(ValueError, match="PIPELOOM_GIL_BATON must be one of"):
        ThreadReadingService(2)
    monkeypatch.setenv("PIPELOOM_GIL_BATON", "off")
    assert ThreadReadingService(2).gil_baton == "off"
    assert repr(ThreadReadingService(2)).endswith("gil_baton='off')")
    assert "gil_baton" not in repr(ThreadReadingService(2, gil_baton="auto"))


def test_with_the_baton_off_workers_never_touch_it():
    service = ThreadReadingService(3, gil_baton="off")
    with DataLoader(IterableWrapper(range(30)).sharding_filter(), service, seed=0) as loader:
        assert list(loader) == list(range(30))
        assert service._runner.pool._baton is None  # noqa: SLF001


@pytest.mark.parametrize(("gil", "expected"), [(True, "auto"), (False, "off")])
def test_auto_is_off_where_python_runs_without_the_gil(monkeypatch, gil, expected):
    # A free-threaded build (3.13t/3.14t) has no GIL to hand over: the baton would only serialize.
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: gil, raising=False)
    assert BatonPolicy("auto").mode == expected
    assert BatonPolicy("on").mode == "on"  # forced, e.g. to measure it
    service = ThreadReadingService(2)
    with DataLoader(IterableWrapper(range(20)).sharding_filter(), service, seed=0) as loader:
        assert list(loader) == list(range(20))
        pool = service._runner.pool  # noqa: SLF001
        assert pool.baton_statistics().mode == expected
        assert (pool._baton is None) == (not gil)  # noqa: SLF001
