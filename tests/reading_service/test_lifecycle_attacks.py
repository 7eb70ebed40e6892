"""Attacks on the lifecycle of loaders: Ctrl-C inside the stop, killed workers, drops, threads.

Every test ends with nothing of its own left behind: no child process (live
or zombie), no thread, no fd or memfd of this process tree
(``tests/own_resources.py``). Waits are on events with short timeouts.
"""

from __future__ import annotations

import functools
import gc
import multiprocessing.connection
import multiprocessing.process
import os
import random
import signal
import subprocess
import sys
import threading

import pytest
import torch

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.errors import WorkerError
from pipeloom.queues import ProcessQueue
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from pipeloom.reading_service.workers.process import WorkerProcess
from pipeloom.reading_service.workers.thread import WorkerThread
from tests.own_resources import OwnResources, wait_for_exit
from tests.reading_service import pipelines
from tests.reading_service.test_separate import with_side_stream


def make_loader(name: str, *, long: bool = False, **kwargs) -> DataLoader:
    """A small loader under strategy ``name`` (``long``: every worker mid-epoch when killed)."""
    items = 160 if long else 40
    if name == "threads":
        service = ThreadReadingService(2, **kwargs)
        return DataLoader(pipelines.for_strategies(items), service, seed=1)
    kwargs["start_method"] = "fork"
    if name == "separate-process":
        pipe = with_side_stream(40) if long else with_side_stream()
        return DataLoader(pipe, MultiProcessingReadingService(2, **kwargs), seed=5)
    if name != "classic":
        kwargs["strategy"] = name
    if name == "economic" and long:
        kwargs["num_batch_workers"] = 1
    pipe = pipelines.for_strategies(items, map_style=name == "economic")
    return DataLoader(pipe, MultiProcessingReadingService(2, **kwargs), seed=1)


NAMES = ["classic", "economic", "chunked", "separate-process", "threads"]
LOADERS = {name: functools.partial(make_loader, name) for name in NAMES}
PROCESS_LOADERS = [name for name in LOADERS if name != "threads"]


@pytest.fixture
def ctrl_c_raises():
    """Python's own SIGINT handler, even when the test run started with SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def own():
    gc.collect()
    return OwnResources()


def interrupt_once(monkeypatch, owner: type, name: str, how: str, after: int = 0) -> list[int]:
    """Make the first call (after ``after`` calls) of ``owner.name`` get Ctrl-C: ``raise``
    KeyboardInterrupt at its start (as if the signal landed there), ``signal`` SIGINT
    to this process there and then do its work, or ``signal-after`` its work. Returns
    the count of interrupts made."""
    original = getattr(owner, name)
    made = [0]
    calls = [0]

    def interrupted(*args, **kwargs):
        calls[0] += 1
        if made[0] or calls[0] <= after:
            return original(*args, **kwargs)
        made[0] += 1
        if how == "raise":
            raise KeyboardInterrupt
        if how == "signal-after":  # Ctrl-C as the call returns
            result = original(*args, **kwargs)
            signal.raise_signal(signal.SIGINT)
            return result
        signal.raise_signal(signal.SIGINT)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, interrupted)
    return made


# -- Ctrl-C during the stop -----------------------------------------------------------

# Points inside the stop of every process pool: the queues are closed, then each worker
# is joined, killed if it lingers, and released (reaped, its descriptors closed).
STOP_POINTS = {
    "closing-a-queue": (ProcessQueue, "close"),
    "joining-a-worker": (multiprocessing.process.BaseProcess, "join"),
    "closing-a-thread": (WorkerThread, "close"),
}
# (loader, persistent_workers, where Ctrl-C lands, how): each factor both ways for the
# classic and the economic pool (chunked shares economic's), once for the others.
INTERRUPTED_STOPS = [
    ("classic", False, "closing-a-queue", "raise"),
    ("classic", True, "joining-a-worker", "signal"),
    ("economic", False, "joining-a-worker", "raise"),
    ("economic", True, "closing-a-queue", "signal"),
    ("chunked", False, "closing-a-queue", "signal"),
    ("separate-process", True, "joining-a-worker", "raise"),
    ("threads", False, "closing-a-thread", "raise"),
]


def interrupted_loader(name: str, persistent: bool) -> tuple[DataLoader, object]:
    """A loader of ``name`` mid-epoch, and its iterator."""
    kwargs = {} if name == "threads" else {"persistent_workers": persistent}
    loader = LOADERS[name](**kwargs)
    iterator = iter(loader)
    next(iterator)
    return loader, iterator


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name, persistent, point, how", INTERRUPTED_STOPS)
def test_ctrl_c_inside_shutdown_still_stops_every_worker_then_propagates(
    name, persistent, point, how, own, ctrl_c_raises, monkeypatch
):
    loader, iterator = interrupted_loader(name, persistent)
    made = interrupt_once(monkeypatch, *STOP_POINTS[point], how)
    with pytest.raises(KeyboardInterrupt):
        loader.shutdown()
    assert made == [1]
    monkeypatch.undo()
    own.assert_released(timeout=5)  # not waiting for a second shutdown() nor the collector
    loader.shutdown()  # a second call does nothing more, and raises nothing
    del iterator, loader


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["raise", "signal"])
def test_ctrl_c_inside_the_with_blocks_exit_still_stops_every_worker(
    how, own, ctrl_c_raises, monkeypatch
):
    with pytest.raises(KeyboardInterrupt):
        with LOADERS["economic"]() as loader:
            iterator = iter(loader)
            next(iterator)
            interrupt_once(monkeypatch, *STOP_POINTS["joining-a-worker"], how)
    monkeypatch.undo()
    own.assert_released(timeout=5)
    del iterator, loader


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["raise", "signal"])
def test_ctrl_c_while_a_dropped_loader_is_freed_still_stops_every_worker(
    how, own, ctrl_c_raises, monkeypatch
):
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    gc.disable()
    try:
        loader, iterator = interrupted_loader("classic", persistent=False)
        interrupt_once(monkeypatch, *STOP_POINTS["closing-a-queue"], how)
        del iterator, loader  # reference counting frees it here, no collection
        # Python cannot raise out of a finalizer: it reports the interrupt instead.
        assert [type(u.exc_value) for u in unraisable] == [KeyboardInterrupt]
        monkeypatch.undo()
        own.assert_released(timeout=5)
    finally:
        gc.enable()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "name, how",
    [
        ("classic", "raise"),
        ("economic", "signal"),
        ("classic", "signal-after"),
        ("chunked", "signal-after"),
        ("separate-process", "signal-after"),
    ],
)
def test_ctrl_c_while_the_workers_start_stops_those_started_and_the_loader_goes_on(
    name, how, own, ctrl_c_raises, monkeypatch
):
    loader = LOADERS[name]()
    # One worker runs; Ctrl-C as the next one starts (the separate process: the third).
    after = 2 if name == "separate-process" else 1
    interrupt_once(monkeypatch, WorkerProcess, "__init__", how, after=after)
    with pytest.raises(KeyboardInterrupt):
        iter(loader)
    monkeypatch.undo()
    if name != "separate-process":  # its reader is stopped with the loader's epoch
        left = own.left_after(timeout=5)
        assert not left, f"left behind by the interrupted start: {left}"
    expected = 4 if name == "separate-process" else 10
    assert len(list(loader)) == expected  # the next epoch starts its workers afresh
    loader.shutdown()
    del loader
    own.assert_released(timeout=5)


@pytest.mark.timeout(30)
def test_ctrl_c_as_the_separate_process_starts_then_shutdown_leaves_nothing(
    own, ctrl_c_raises, monkeypatch
):
    # The process was started, then Ctrl-C landed before its reader kept it: nothing
    # stopped or reaped it (a zombie and two pipes, unless a later start reaped it).
    loader = LOADERS["separate-process"]()
    interrupt_once(monkeypatch, WorkerProcess, "__init__", "signal-after", after=2)
    with pytest.raises(KeyboardInterrupt):
        iter(loader)
    monkeypatch.undo()
    loader.shutdown()
    del loader
    own.assert_released(timeout=5)


def epoch_of(epoch: int, map_style: bool = False) -> list:
    """Epoch ``epoch`` of ``LOADERS``' pipeline, made in the calling thread."""
    with DataLoader(pipelines.for_strategies(40, map_style=map_style), seed=1) as loader:
        loader.set_epoch(epoch)
        return list(loader)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "point, after",
    [
        ((ProcessQueue, "get"), 0),  # iter() cancels the abandoned epoch: reads to each END
        ((multiprocessing.connection.Connection, "send"), 1),  # iter() starts worker 1's epoch
    ],
    ids=["cancelling-the-last-epoch", "starting-the-next"],
)
def test_ctrl_c_during_iter_leaves_persistent_workers_no_stale_items(
    point, after, own, ctrl_c_raises, monkeypatch
):
    loader = LOADERS["classic"](persistent_workers=True)
    iterator = iter(loader)
    next(iterator)  # then abandoned: the workers are mid-epoch
    interrupt_once(monkeypatch, *point, "raise", after=after)
    with pytest.raises(KeyboardInterrupt):
        iter(loader)
    monkeypatch.undo()
    for _ in range(2):  # each later epoch is exactly the epoch it says it is
        iterator = iter(loader)
        torch.testing.assert_close(list(iterator), epoch_of(iterator.epoch))
    loader.shutdown()
    del iterator, loader
    own.assert_released(timeout=5)


# -- a stop that needs no kill ------------------------------------------------------------


def say_started(fd: int, worker_id: int) -> None:
    os.write(fd, b"x")


def read_exactly(fd: int, count: int) -> bytes:
    data = b""
    while len(data) < count:  # blocking reads: each returns what the workers wrote
        data += os.read(fd, count - len(data))
    return data


@pytest.mark.timeout(30)
def test_workers_whose_queue_was_never_read_exit_on_their_own_at_shutdown(own, monkeypatch):
    # Stopped before the merge read (or waited on) a worker's queue: the worker fills it
    # and waits for room. shutdown() closes the queue: the worker must hear it and exit,
    # not wait to be killed after the stop's grace period (a second per shutdown).
    codes = []
    release = WorkerProcess.release

    def recorded(self):
        codes.append(self.process.exitcode)
        release(self)

    monkeypatch.setattr(WorkerProcess, "release", recorded)
    started, say = os.pipe()
    pipe = IterableWrapper(range(96)).sharding_filter().map(pipelines.draw).batch(4)
    service = MultiProcessingReadingService(
        3, start_method="fork", worker_init_fn=functools.partial(say_started, say)
    )
    loader = DataLoader(pipe, service, seed=1)
    iterator = iter(loader)
    assert len(read_exactly(started, 3)) == 3  # every worker is producing its epoch
    loader.shutdown()
    os.close(started)
    os.close(say)
    assert codes == [0, 0, 0], "a worker had to be killed: it never heard the stop"
    del iterator, loader
    own.assert_released(timeout=5)


# -- kill -9 from outside -----------------------------------------------------------------

LONG = {  # epochs long enough that every worker is mid-epoch when killed
    name: functools.partial(make_loader, name, long=True) for name in NAMES if name != "threads"
}


def workers() -> list[multiprocessing.process.BaseProcess]:
    """This process's pipeloom worker processes (item, batch, classic, separate)."""
    return sorted(
        (p for p in multiprocessing.active_children() if p.name.startswith("pipeloom-")),
        key=lambda p: p.name,
    )


def kill_one(rng: random.Random) -> tuple[int, str]:
    """SIGKILL a worker chosen by ``rng``; its pid and the label errors give it."""
    victim = rng.choice(workers())
    os.kill(victim.pid, signal.SIGKILL)
    return victim.pid, victim.name


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", list(LONG))
def test_a_worker_killed_at_a_random_moment_mid_epoch_is_named(name, own):
    rng = random.Random(f"mid-epoch {name}")
    for persistent in (False, True):  # two victims, two moments, per strategy
        loader = LONG[name](persistent_workers=persistent)
        iterator = iter(loader)
        for _ in range(rng.randrange(1, 4)):
            next(iterator)
        pid, _label = kill_one(rng)
        with pytest.raises(WorkerError, match=rf"\(pid {pid}\) was killed by signal 9 \(SIGKILL\)"):
            for _ in iterator:
                pass
        if persistent:  # said once: the next epoch runs on new workers
            assert len(list(loader)) == 40
        loader.shutdown()
        del iterator, loader
    own.assert_released(timeout=5)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["classic", "economic", "chunked"])
def test_a_persistent_worker_killed_between_epochs_is_named_at_the_next(name, own):
    with LONG[name](persistent_workers=True) as loader:
        iterator = iter(loader)
        next(iterator)
        del iterator  # the epoch is abandoned: the persistent workers cancel it and wait
        pid, _label = kill_one(random.Random(f"between {name}"))
        with pytest.raises(WorkerError, match=rf"\(pid {pid}\) was killed by signal 9 \(SIGKILL\)"):
            list(loader)
        assert len(list(loader)) == 40  # said once: the next epoch runs on new workers
    own.assert_released(timeout=5)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["classic", "economic", "separate-process"])
def test_a_worker_killed_during_shutdown_leaves_nothing_and_raises_nothing(name, own, monkeypatch):
    loader = LONG[name]()
    iterator = iter(loader)
    next(iterator)
    rng = random.Random(f"shutdown {name}")
    close = ProcessQueue.close
    killed = []

    def close_after_a_kill(queue):
        if not killed:  # the stop has begun: its first queue is being closed
            killed.append(kill_one(rng))
        close(queue)

    monkeypatch.setattr(ProcessQueue, "close", close_after_a_kill)
    loader.shutdown()
    assert killed
    monkeypatch.undo()
    del iterator, loader
    own.assert_released(timeout=5)


@pytest.mark.timeout(30)
def test_a_checkpoint_taken_before_a_worker_was_killed_resumes_exactly(own):
    with DataLoader(pipelines.for_strategies(160), seed=1) as ref:
        reference = list(ref)  # in the calling thread: the same items, as every service's
    loader = LONG["classic"]()
    iterator = iter(loader)
    delivered = [next(iterator) for _ in range(3)]
    state = loader.state_dict()
    pid, _label = kill_one(random.Random("checkpoint"))
    with pytest.raises(WorkerError, match=rf"\(pid {pid}\)"):
        for _ in iterator:
            pass
    loader.shutdown()
    del iterator, loader
    # A state of worker processes resumes under threads too (fast: nothing to start).
    with DataLoader(pipelines.for_strategies(160), ThreadReadingService(2), seed=1) as resumed:
        resumed.load_state_dict(state)
        rest = list(resumed)
    torch.testing.assert_close(delivered + rest, reference)
    own.assert_released(timeout=5)


# -- a loader never freed: the interpreter's exit stops it ---------------------------------

AT_EXIT = """
import gc, psutil
from tests.reading_service.test_lifecycle_attacks import LONG
gc.disable()
class Trainer:
    pass
trainer = Trainer()
trainer.me = trainer  # a cycle, and no collection: only the interpreter's exit frees it
trainer.loader = LONG[{name!r}]()
trainer.iterator = iter(trainer.loader)
next(trainer.iterator)
print(" ".join(str(p.pid) for p in psutil.Process().children(recursive=True)), flush=True)
"""


@pytest.mark.slow  # a fresh interpreter per strategy: about 3 s each
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(LONG))
def test_a_loader_left_in_a_cycle_is_stopped_at_interpreter_exit(name):
    result = subprocess.run(
        [sys.executable, "-c", AT_EXIT.format(name=name)],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr[-3000:]
    pids = [int(pid) for pid in result.stdout.split()]
    assert pids
    assert wait_for_exit(pids, timeout=5) == []


# -- shutdown from several threads, inside the loop; iterating after it -------------------


def keeping_errors(func, errors: list[BaseException]) -> None:
    try:
        func()
    except BaseException as error:  # noqa: BLE001 - the test asserts there were none
        errors.append(error)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["classic", "economic", "threads"])
def test_shutdown_from_threads_and_inside_the_loop_then_iterating_says_why(name, own):
    loader = LOADERS[name]()
    iterator = iter(loader)
    errors: list[BaseException] = []
    for _ in iterator:  # shut down from inside the loop, by this and three other threads
        threads = [
            threading.Thread(target=keeping_errors, args=(loader.shutdown, errors))
            for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        keeping_errors(loader.shutdown, errors)
        for thread in threads:
            thread.join(10)
        break
    assert errors == []
    with pytest.raises(RuntimeError, match=r"no longer valid: shutdown\(\) stopped the loader"):
        next(iterator)
    with pytest.raises(RuntimeError, match="shut down; create a new one"):
        iter(loader)
    del iterator, loader, threads
    own.assert_released(timeout=5)
