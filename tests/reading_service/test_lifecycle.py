"""Reading-service lifecycles: bounded memory, Ctrl-C, garbage collection, killed workers.

Every test here leaves nothing behind: no child process (live or zombie), no
thread, no /dev/shm entry. Waits are on events with timeouts, never sleeps.
"""

from __future__ import annotations

import functools
import gc
import io
import json
import multiprocessing
import os
import signal
import statistics
import tarfile
import threading
import types

import psutil
import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import FileLister, IterableWrapper, _files
from pipeloom.errors import WorkerError
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from pipeloom.reading_service.strategies.classic import process_pool
from pipeloom.reading_service.strategies.runner import drain
from tests.own_resources import OwnResources
from tests.reading_service import pipelines

ITEM = pipelines.BIG_ITEM_BYTES


# -- what a test leaves behind ---------------------------------------------------


class Leftovers:
    """Child processes, threads and fds (memfds included) of this process tree made since.

    Only the test's own resources count: /dev/shm and the process list are
    shared with every other job on the machine (``tests/own_resources.py``).
    """

    def __init__(self) -> None:
        self.own = OwnResources()
        self.children = {p.pid for p in psutil.Process().children(recursive=True)}
        self.threads = set(threading.enumerate())

    def new_children(self) -> list[psutil.Process]:
        """Children started since; a zombie (exited, not reaped) counts too."""
        return [p for p in psutil.Process().children(recursive=True) if p.pid not in self.children]

    def assert_none(self) -> None:
        gc.collect()
        assert multiprocessing.active_children() == []
        left = self.own.left_after(timeout=10)
        assert not left, f"left behind: {left}"


def count_calls(monkeypatch, owner: type, name: str) -> list[int]:
    """Count calls of ``owner.name`` (a waiter that sleeps calls it a few times, a busy one
    thousands): an event-driven check, unlike CPU time or wall clock on a loaded machine."""
    calls = [0]
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def _status(process: psutil.Process) -> str:
    try:
        return process.status()
    except psutil.NoSuchProcess:
        return "gone"


@pytest.fixture
def leftovers():
    gc.collect()
    return Leftovers()


def tree_rss() -> int:
    """Resident memory of this process and all its children, in bytes."""
    total = 0
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


class Release:
    """A pipe whose read end becomes readable (for every forked worker) on ``set()``."""

    def __init__(self) -> None:
        self.fd, self._write = os.pipe()

    def set(self) -> None:
        os.write(self._write, b"x")

    def close(self) -> None:
        os.close(self.fd)
        os.close(self._write)


def worker_pid(name: str) -> int:
    (pid,) = [p.pid for p in multiprocessing.active_children() if p.name == name]
    return pid


# -- (a) backpressure: memory stays flat under a slow consumer --------------------


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "make_service, workers",
    [
        (lambda: MultiProcessingReadingService(2, prefetch_factor=2), 2),
        (lambda: ThreadReadingService(2, prefetch_factor=2), 2),
    ],
    ids=["processes", "threads"],
)
def test_a_slow_consumer_keeps_memory_flat(make_service, workers, leftovers):
    count, prefetch = 60, 2
    pipe = IterableWrapper(range(count)).sharding_filter().map(pipelines.big_array)
    slow = threading.Event()  # never set: wait(0.02) is the consumer's 20 ms "training step"
    samples = []
    with DataLoader(pipe, make_service(), seed=0) as loader:
        for i, item in enumerate(loader):
            assert item.nbytes == ITEM and item[0] == item[-1] == i
            del item
            slow.wait(0.02)
            samples.append(tree_rss())
    warm = samples[5:]  # workers started, queues filled, allocator pools grown
    in_flight = workers * (prefetch + 1) + 2  # queued + being built per worker, + consumer's
    # Shared-memory pages are counted in both processes' RSS: allow twice the items in flight.
    assert max(warm) - min(warm) < 2 * in_flight * ITEM, [s >> 20 for s in samples]
    assert max(warm) - statistics.median(warm) < 2 * in_flight * ITEM
    assert max(warm) - min(warm) < count * ITEM / 2, "memory grew with the items produced"
    leftovers.assert_none()


# -- (b) Ctrl-C ---------------------------------------------------------------------------


@pytest.fixture
def ctrl_c_raises():
    """Python's own SIGINT handler, even when the test run started with SIGINT ignored
    (a shell starts background jobs that way, and Python then keeps it ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.timeout(20)
def test_keyboard_interrupt_in_the_consumer_loop_stops_every_worker(leftovers, ctrl_c_raises):
    loader = DataLoader(
        IterableWrapper(range(10_000)).sharding_filter().map(pipelines.big_array),
        MultiProcessingReadingService(2),
        seed=0,
    )
    with pytest.raises(KeyboardInterrupt):
        for i, _ in enumerate(loader):
            if i == 3:
                signal.raise_signal(signal.SIGINT)  # what Ctrl-C does, in the main thread
    del loader, _  # the last item maps its worker's shared memory
    leftovers.assert_none()


@pytest.mark.timeout(20)
def test_keyboard_interrupt_while_blocked_waiting_for_a_worker_stops_every_worker(
    leftovers, ctrl_c_raises
):
    release = Release()
    stuck = functools.partial(pipelines.stuck_at, at=0, release_fd=release.fd)
    loader = DataLoader(
        IterableWrapper(range(100)).sharding_filter().map(stuck),
        MultiProcessingReadingService(2, start_method="fork"),
        seed=0,
    )
    iterator = iter(loader)
    # Ctrl-C arrives while the main thread sleeps in the merge's selector; worker 0
    # is busy in user code and sees nothing (workers ignore SIGINT).
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(iterator)
    finally:
        timer.join()
        release.set()
    del iterator, loader
    release.close()
    leftovers.assert_none()


# -- (c) garbage collection mid-epoch -------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
def test_del_loader_mid_epoch_leaves_no_process_or_shared_memory(persistent, leftovers):
    loader = DataLoader(
        IterableWrapper(range(10_000)).sharding_filter().map(pipelines.big_array),
        MultiProcessingReadingService(2, persistent_workers=persistent),
        seed=0,
    )
    iterator = iter(loader)
    for _ in range(5):
        next(iterator)
    assert len(leftovers.new_children()) >= 2
    del iterator, loader
    leftovers.assert_none()


@pytest.mark.timeout(30)
def test_del_loader_mid_epoch_stops_worker_threads(leftovers):
    loader = DataLoader(
        IterableWrapper(range(10_000)).sharding_filter().map(pipelines.slow_item),
        ThreadReadingService(3),
        seed=0,
    )
    iterator = iter(loader)
    assert [next(iterator) for _ in range(5)] == [0, 1, 2, 3, 4]
    assert len(set(threading.enumerate()) - leftovers.threads) == 3
    del iterator, loader
    leftovers.assert_none()


# -- (d) a worker killed from outside ---------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("victim", [0, 1], ids=["awaited-worker", "other-worker"])
def test_a_worker_killed_while_the_main_waits_raises_naming_it(victim, leftovers, monkeypatch):
    # Worker 0 is stuck on item 0, so the merge waits on worker 0; worker 1 fills
    # its queue and waits for room. Killing either must raise at once: never hang,
    # never busy-wait on the dead worker's sentinel.
    release = Release()
    stuck = functools.partial(pipelines.stuck_at, at=0, release_fd=release.fd)
    loader = DataLoader(
        IterableWrapper(range(8)).sharding_filter().map(stuck),
        MultiProcessingReadingService(2, start_method="fork"),
        seed=0,
    )
    iterator = iter(loader)
    pid = worker_pid(f"pipeloom-worker-{victim}")
    polls = count_calls(monkeypatch, process_pool._ProcessChannel, "get_nowait")
    killer = threading.Timer(0.3, os.kill, (pid, signal.SIGKILL))
    killer.start()
    try:
        expected = rf"worker process {victim} \(pid {pid}\) was killed by signal 9 \(SIGKILL\)"
        with pytest.raises(WorkerError, match=expected):
            list(iterator)
    finally:
        killer.join()
        release.set()
    assert polls[0] < 100, "busy-waited: the merge polled the workers instead of sleeping"
    loader.shutdown()
    del iterator, loader
    release.close()
    leftovers.assert_none()


# -- (e) persistent workers --------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "transient"])
def test_persistent_workers_keep_their_pids_across_epochs(persistent, leftovers):
    pipe = IterableWrapper(range(8)).sharding_filter().map(pipelines.pid_of_worker)
    service = MultiProcessingReadingService(2, persistent_workers=persistent)
    with DataLoader(pipe, service, seed=0) as loader:
        epochs = [list(loader) for _ in range(3)]
    for epoch in epochs:
        assert [x for x, _, _ in epoch] == list(range(8))
        assert [worker for x, _, worker in epoch] == [x % 2 for x in range(8)]
    pids = [{pid for _, pid, _ in epoch} for epoch in epochs]
    assert all(len(p) == 2 and os.getpid() not in p for p in pids)
    if persistent:
        assert pids[0] == pids[1] == pids[2]
    else:
        assert not (pids[0] & pids[1]) and not (pids[1] & pids[2])
    leftovers.assert_none()


# -- (f) storage across processes ------------------------------------------------------------------


def write_shards(root, shards: int = 5, samples: int = 3) -> list[str]:
    paths = []
    for s in range(shards):
        path = os.path.join(root, f"shard-{s:03d}.tar")
        with tarfile.open(path, "w") as tar:
            for k in range(samples):
                key = f"sample-{s:03d}-{k}"
                members = {
                    ".cls": str(10 * s + k).encode(),
                    ".json": json.dumps({"s": s, "k": k}).encode(),
                }
                for extension, data in members.items():
                    info = tarfile.TarInfo(key + extension)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def tar_pipeline(root, explicit_sharding_filter: bool = True):
    files = FileLister(str(root), "*.tar")
    if explicit_sharding_filter:
        files = files.sharding_filter()
    return (
        files.open_files("rb")  # without a sharding_filter, FileOpener is the sharding point
        .load_from_tar()
        .webdataset()
        .decode()
        .map(pipelines.sample_and_worker)
        .batch(2)
    )


@pytest.mark.timeout(30)
# FileOpener is itself a sharding point; after an explicit sharding_filter it passes
# every path through and keeps the filter's positions.
@pytest.mark.parametrize(
    "explicit", [False, True], ids=["opener-shards", "sharding-filter-then-opener"]
)
def test_tar_shards_across_processes_equal_in_process_and_each_worker_opens_its_own(
    explicit, tmp_path, monkeypatch, leftovers
):
    data = tmp_path / "data"
    data.mkdir()
    shards = write_shards(data)
    log = tmp_path / "opens.log"
    expected = list(DataLoader(tar_pipeline(data, explicit), seed=0))
    assert len(expected) == 8 and expected[0][0][:2] == ("sample-000-0", 0)
    # Under fork the workers inherit the patched module global that FileOpener calls.
    hook = functools.partial(pipelines.logged_open, log)
    monkeypatch.setattr(_files, "open", hook, raising=False)
    service = MultiProcessingReadingService(2, start_method="fork")
    with DataLoader(tar_pipeline(data, explicit), service, seed=0) as loader:
        got = list(loader)
    strip = lambda batches: [[x[:3] for x in batch] for batch in batches]  # noqa: E731
    assert strip(got) == strip(expected)
    # Each sample was made by the worker owning its shard (shard i -> worker i % 2) ...
    for batch in got:
        for _key, cls, meta, worker in batch:
            assert worker == meta["s"] % 2 and cls == 10 * meta["s"] + meta["k"]
    # ... and each worker opened exactly its own shards, once each.
    opened: dict[int, list[str]] = {}
    for line in log.read_text().splitlines():
        pid, path = line.split(" ", 1)
        opened.setdefault(int(pid), []).append(path)
    assert os.getpid() not in opened
    assert sorted(sorted(paths) for paths in opened.values()) == [shards[0::2], shards[1::2]]
    leftovers.assert_none()


def test_an_epoch_closed_before_its_first_item_still_ends_its_work():
    ended: list[bool] = []
    drain(IterableWrapper(range(3)), on_close=ended.append).close()
    assert ended == [False]  # persistent workers cancel the epoch before the next one starts


def test_a_patient_cancel_waits_for_a_worker_that_is_alive_but_slow():
    # a persistent worker still starting, or in a long fetch, when its epoch is cancelled:
    # restarting it would lose its RNG streams (reseed_global_rngs=False), so wait on
    class SlowQueue:
        waits = 0

        def get(self, timeout):
            self.waits += 1
            if self.waits < 3:
                raise TimeoutError("nothing yet")
            return process_pool.END

    class Alive:
        def exit_code(self):
            return None

    channel = types.SimpleNamespace(queue=SlowQueue(), worker=Alive(), ended=False)
    processes = types.SimpleNamespace(cancels=[], channels=[channel])
    with pytest.raises(TimeoutError):
        process_pool._Processes.cancel_epoch(processes, 0.01)  # type: ignore[arg-type]
    process_pool._Processes.cancel_epoch(processes, 0.01, patient=True)  # type: ignore[arg-type]
    assert channel.ended and channel.queue.waits == 3
