"""The sampler reads every thread's stack without freezing the process.

On CPython 3.11 ``sys._current_frames()`` can deadlock when a garbage
collection it triggers frees a ``threading.local`` (CPython gh-106883): the
full suite once froze for the whole CI budget in a ``stats=True`` loader.
The workload below (threads entering fresh frames and dropping thread-locals
in reference cycles, a tiny collection threshold) froze an unguarded
``sys._current_frames()`` loop within a second in every try.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHURN = textwrap.dedent(
    """
    import gc, sys, threading, time
    from pipeloom.stats._sampler import thread_frames

    gc.set_threshold(7, 2, 2)
    stop = threading.Event()

    def inner():
        return [[] for _ in range(3)]

    def make():
        local = threading.local()
        local.x = 1
        cycle = [local]
        cycle.append(cycle)  # freed by the collector, not by reference counting
        return inner()

    def churn():
        while not stop.is_set():
            make()

    def sample():
        while not stop.is_set():
            for frame in thread_frames().values():
                while frame is not None:
                    frame = frame.f_back

    threads = [threading.Thread(target=churn, daemon=True) for _ in range(3)]
    threads.append(threading.Thread(target=sample, daemon=True))
    for thread in threads:
        thread.start()
    stop.wait(3.0)
    stop.set()
    for thread in threads:
        thread.join(5.0)
    assert gc.isenabled()
    print("done")
    """
)


def test_sampling_stacks_while_the_collector_frees_thread_locals_does_not_freeze():
    done = subprocess.run([sys.executable, "-c", CHURN], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"


def test_a_collector_the_user_disabled_stays_disabled():
    import gc

    from pipeloom.stats._sampler import thread_frames

    gc.disable()
    try:
        assert thread_frames()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_long_run_keeps_the_last_hour_of_timeline():
    from pipeloom.stats._sampler import WINDOW, Sampler
    from pipeloom.stats.counters import LoaderCounters

    kept = int(3600 / WINDOW)  # the last hour
    windows = kept + 100  # one sample per half second for an hour and 50 s
    sampler, counters = Sampler(), LoaderCounters()
    for index in range(windows):
        sampler.started -= WINDOW  # the same clock reading falls in the next window
        sampler.sample_once()
        # the middle of window ``index``: its start can round into the window before
        at = counters._perf_started + (index + 0.5) * WINDOW  # noqa: SLF001 - its clock
        counters.record(at, at, True, None)
    # was one bucket per half second since the start (~170,000 a day, in every process)
    assert len(sampler.timeline) == kept and min(sampler.timeline) > 100
    assert len(counters.windows) == kept and min(counters.windows) == 100
    assert counters.outputs == windows  # the totals still cover the whole run


def test_a_stack_that_changes_under_the_walk_does_not_stop_the_sampler(monkeypatch):
    # On 3.11 the frames of another thread can change while the sampler walks them (the
    # walk runs Python: isinstance, f_locals), and once a walk met a function where a
    # frame was: the AttributeError killed the sampler thread, and stats() stopped counting.
    import threading
    import time

    import pipeloom
    from pipeloom.datapipes import IterableWrapper

    real = sys._current_frames
    torn = threading.Event()

    def with_a_torn_stack():
        frames = dict(real())
        frames[-1] = test_a_stack_that_changes_under_the_walk_does_not_stop_the_sampler
        torn.set()
        return frames

    monkeypatch.setattr(sys, "_current_frames", with_a_torn_stack)
    with pipeloom.DataLoader(IterableWrapper(range(10**6)), stats=True) as loader:
        iterator = iter(loader)
        assert torn.wait(10)  # the sampler met the torn stack
        deadline = time.monotonic() + 10
        while loader.stats().samples < 5 and time.monotonic() < deadline:
            next(iterator)  # the consumer's work, while the sampler samples
    assert loader.stats().samples >= 5
