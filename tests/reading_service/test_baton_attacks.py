"""Attacks on the worker threads' GIL baton (workers/baton.py): errors and BaseExceptions
while it is held, early breaks, checkpoints mid-epoch resumed under another thread count,
checkpoints taken from another thread, a holder blocked forever at shutdown."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.errors import WorkerError
from pipeloom.reading_service import InProcessReadingService, ThreadReadingService
from pipeloom.reading_service.workers import thread as thread_module
from tests.reading_service import pipelines

pytestmark = pytest.mark.timeout(120)

modes = st.sampled_from(["on", "auto", "off"])


def _worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("pipeloom-worker-")]


def _triple(x: int) -> int:
    return x * 3


def _pipe(n: int):
    return IterableWrapper(range(n)).sharding_filter().map(_triple).batch(4)


@settings(max_examples=15, deadline=None)
@given(
    threads=st.integers(2, 4),
    mode=modes,
    seed=st.integers(0, 2**16),
    n=st.integers(0, 50),
    stop=st.integers(0, 8),
)
def test_an_early_break_then_the_next_epochs_equal_in_process(threads, mode, seed, n, stop):
    reference = DataLoader(pipelines.augmented(n, batch=3), InProcessReadingService(), seed=seed)
    expected = [list(reference) for _ in range(3)]
    service = ThreadReadingService(threads, gil_baton=mode)
    with DataLoader(pipelines.augmented(n, batch=3), service, seed=seed) as loader:
        head = []
        for batch in loader:
            if len(head) == stop:
                break
            head.append(batch)
        assert head == expected[0][:stop]
        assert [list(loader), list(loader)] == expected[1:]  # epochs 1 and 2, whole
    assert _worker_threads() == []


@settings(max_examples=15, deadline=None)
@given(
    before=st.tuples(st.integers(1, 4), modes),
    after=st.tuples(st.integers(0, 4), modes),
    taken=st.integers(0, 12),
)
def test_a_checkpoint_mid_epoch_resumes_under_another_thread_count_and_mode(before, after, taken):
    expected = list(DataLoader(_pipe(45), seed=0))
    with DataLoader(_pipe(45), ThreadReadingService(before[0], gil_baton=before[1]), seed=0) as a:
        iterator = iter(a)
        head = [next(iterator) for _ in range(taken)]
        state = a.state_dict()
    service = (
        InProcessReadingService()
        if after[0] == 0
        else ThreadReadingService(after[0], gil_baton=after[1])
    )
    with DataLoader(_pipe(45), service, seed=0) as b:
        b.load_state_dict(state)
        assert head + list(b) == expected  # no batch twice, none dropped


def test_a_checkpoint_taken_from_another_thread_between_steps():
    expected = list(DataLoader(_pipe(60), seed=0))
    with DataLoader(_pipe(60), ThreadReadingService(3, gil_baton="on"), seed=0) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(4)]
        states: list = []
        other = threading.Thread(target=lambda: states.append(loader.state_dict()))
        other.start()
        other.join(timeout=30)
        assert not other.is_alive() and len(states) == 1
        rest_here = list(iterator)
    assert head + rest_here == expected
    with DataLoader(_pipe(60), ThreadReadingService(2, gil_baton="on"), seed=0) as loader:
        loader.load_state_dict(states[0])
        assert head + list(loader) == expected


class _Interrupt(BaseException):
    """Like KeyboardInterrupt: not an Exception."""


def _interrupt_at_7(x: int) -> int:
    if x == 7:
        raise _Interrupt("stopped at 7")
    return x


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("mode", ["on", "auto"])
def test_a_base_exception_while_holding_reaches_the_main_process_then_the_next_epoch_runs(
    mode,
):
    pipe = IterableWrapper(range(20)).sharding_filter().map(_interrupt_at_7)
    with DataLoader(pipe, ThreadReadingService(3, gil_baton=mode), seed=0) as loader:
        seen = []
        with pytest.raises(WorkerError, match="stopped at 7"):
            for item in loader:
                seen.append(item)
        assert seen == list(range(7))  # everything before it, in order
        # (the worker thread re-raises it after sending it: threading.excepthook sees it)
        with pytest.raises(WorkerError, match="stopped at 7"):
            list(loader)  # the next epoch: no worker stuck on the old baton
    assert _worker_threads() == []


def test_a_holder_blocked_forever_does_not_hang_shutdown(monkeypatch):
    monkeypatch.setattr(thread_module, "STOP_TIMEOUT", 1.0)
    entered, release = threading.Event(), threading.Event()

    def block_at_5(x: int) -> int:
        if x == 5:
            entered.set()
            release.wait(60)  # an I/O read that never returns, holding the baton
        return x

    pipe = IterableWrapper(range(40)).sharding_filter().map(block_at_5)
    loader = DataLoader(pipe, ThreadReadingService(2, gil_baton="on"), seed=0)
    try:
        epoch = iter(loader)  # starts the worker threads (kept: dropping it ends the epoch)
        # Worker thread 1 makes 1 and 3 (its queue holds 2), then blocks at 5 holding the
        # baton, and worker thread 0 waits for the baton (a blocked holder holds the others
        # back). Nothing is read: how many of 0 and 2 come before 5 depends on the turns.
        assert entered.wait(30)
        closer = threading.Thread(target=loader.shutdown)
        closer.start()
        closer.join(timeout=30)
        assert not closer.is_alive(), "shutdown hung on a worker blocked holding the baton"
        del epoch
    finally:
        release.set()
    for thread in _worker_threads():
        thread.join(timeout=30)
    assert _worker_threads() == []
