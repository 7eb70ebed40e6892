"""Separate processes: a block marked ``is_separate_process()`` runs, with its upstream, alone.

The main pipeline reads it through a ``SeparateProcessReader`` (``_separate.py``).
Such a block must be on a branch that the workers neither replicate nor feed:
here a *side stream* zipped with the workers' output. Every item records the
PID of the process that made it, so the tests see where each part ran.

Every multiprocess test leaves nothing behind (no child process, thread or
/dev/shm entry); waits are on events, pipes and timers, never sleeps.
"""

from __future__ import annotations

import functools
import gc
import multiprocessing
import os
import pickle
import signal
import threading
from multiprocessing import forkserver

import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, IterDataPipe, MapDataPipe, item_rng
from pipeloom.errors import WorkerError
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)
from pipeloom.reading_service.workers.process import worker_context
from pipeloom.reading_service.workers.separate_process import SeparateProcessReader
from tests.reading_service import pipelines, test_lifecycle
from tests.reading_service.test_lifecycle import Release, worker_pid

BATCH = 3


# -- blocks and pipelines (module level, so spawned processes can import them) ----------


class InOwnProcess(IterDataPipe):
    """Passes its source through, and asks to run (with its source) in a process of its own."""

    inputs = ("source",)

    def __init__(self, source: IterDataPipe) -> None:
        self.source = source

    def is_separate_process(self) -> bool:
        return True

    def __iter__(self):
        yield from self.source


class MarkedTable(MapDataPipe):
    """A map-style block that asks for a process of its own (which only iterable blocks get)."""

    def is_separate_process(self) -> bool:
        return True

    def __getitem__(self, index):
        return index

    def __len__(self) -> int:
        return 100


class Lookup(IterDataPipe):
    """``(key, table[i])`` for the ``i``-th key: reads a map-style block in the main process."""

    inputs = ("keys", "table")

    def __init__(self, keys: IterDataPipe, table: MapDataPipe) -> None:
        self.keys, self.table = keys, table

    def __iter__(self):
        for i, key in enumerate(self.keys):
            yield key, self.table[i]


def made(x):
    """``(x, a draw of item_rng(), pid)``: the item, its randomness, and where it was made."""
    return x, int(item_rng().integers(1000)), os.getpid()


def killed_at_13(x: int) -> int:
    if x == 13:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def with_side_stream(batches: int = 4) -> IterDataPipe:
    """Shuffled batches made by the workers, zipped with a shuffled side stream.

    The side stream draws ``item_rng()`` in its own process and again after it,
    in the main process: both draws depend on the item stamps it sends along.
    """
    from_workers = (
        IterableWrapper(range(batches * BATCH)).shuffle().sharding_filter().map(made).batch(BATCH)
    )
    side = InOwnProcess(IterableWrapper(range(batches)).shuffle().map(made)).map(made)
    return from_workers.zip(side)


def without_pids(items: list) -> list:
    return [
        ([(x, draw) for x, draw, _ in batch], (side[:2], draw)) for batch, (side, draw, _) in items
    ]


def pids(items: list) -> tuple[set[int], set[int], set[int]]:
    """PIDs of the workers, of the side stream's process, and of what ran after it."""
    workers = {pid for batch, _ in items for _, _, pid in batch}
    separate = {side[2] for _, (side, _, _) in items}
    after = {pid for _, (_, _, pid) in items}
    return workers, separate, after


def reference(epochs: int = 2) -> list[list]:
    loader = DataLoader(with_side_stream(), seed=5)
    return [without_pids(list(loader)) for _ in range(epochs)]


SERVICES = {
    "processes-fork": lambda: MultiProcessingReadingService(2, start_method="fork"),
    "processes-forkserver": lambda: MultiProcessingReadingService(
        2, start_method="forkserver", timeout=60
    ),
    "threads": lambda: ThreadReadingService(2),
    "economic": lambda: MultiProcessingReadingService(2, strategy="economic"),
    "chunked": lambda: MultiProcessingReadingService(2, strategy="chunked"),
}


@pytest.fixture
def leftovers():
    # The fork server, and the resource tracker it starts, serve the whole session:
    # started before the snapshot, they are no leftover of the first test to use them.
    worker_context("forkserver")  # with pipeloom preloaded, as the services start it
    forkserver.ensure_running()
    gc.collect()
    return test_lifecycle.Leftovers()


# -- where the marked block runs, and what it yields --------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("make_service", SERVICES.values(), ids=SERVICES.keys())
def test_a_marked_block_runs_in_a_process_of_its_own(make_service, leftovers):
    with DataLoader(with_side_stream(), make_service(), seed=5) as loader:
        items = list(loader)
    workers, separate, after = pids(items)
    main = os.getpid()
    assert len(separate) == 1 and separate.isdisjoint(workers | {main})
    assert after == {main}  # the blocks after the marked one run in the main process
    if isinstance(loader.reading_service, MultiProcessingReadingService):
        assert main not in workers
    leftovers.assert_none()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("make_service", SERVICES.values(), ids=SERVICES.keys())
def test_items_order_and_item_rng_equal_the_in_process_run_over_two_epochs(make_service, leftovers):
    expected = reference()
    assert expected[0] != expected[1]  # each epoch shuffles and draws anew
    with DataLoader(with_side_stream(), make_service(), seed=5) as loader:
        epochs = [list(loader) for _ in range(2)]
    assert [without_pids(epoch) for epoch in epochs] == expected
    first, second = (pids(epoch)[1] for epoch in epochs)
    assert first != second  # a fresh process each epoch
    leftovers.assert_none()


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "make_service",
    [
        lambda: None,
        InProcessReadingService,
        lambda: MultiProcessingReadingService(0),
        lambda: ThreadReadingService(0),
    ],
    ids=["plain-loader", "in-process", "zero-processes", "zero-threads"],
)
def test_in_process_the_mark_is_ignored(make_service, leftovers):
    service = make_service()
    args = () if service is None else (service,)
    loader = DataLoader(with_side_stream(), *args, seed=5)
    items = list(loader)
    assert pids(items) == ({os.getpid()}, {os.getpid()}, {os.getpid()})
    assert without_pids(items) == reference(epochs=1)[0]
    assert leftovers.new_children() == []


@pytest.mark.timeout(20)
def test_in_process_a_rank_keeps_its_shard_and_ignores_a_mark_in_the_shared_part():
    # A rank's in-process service cuts the pipeline like the worker services do,
    # where a mark upstream of the sharding point is refused; in-process it is ignored.
    service = InProcessReadingService()
    service.set_outer_sharding(2, 1)
    pipe = InOwnProcess(IterableWrapper(range(6)).map(made)).sharding_filter()
    items = list(DataLoader(pipe, service, seed=5))
    main = os.getpid()
    assert [(x, pid) for x, _, pid in items] == [(1, main), (3, main), (5, main)]


# -- failures --------------------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_an_exception_in_the_separate_process_reraises_with_its_type_and_origin(method, leftovers):
    side = InOwnProcess(IterableWrapper(range(10)).map(pipelines.explode_at_seven))
    pipe = IterableWrapper(range(10)).sharding_filter().zip(side)
    service = MultiProcessingReadingService(2, start_method=method, timeout=60)
    with DataLoader(pipe, service, seed=0) as loader:
        iterator = iter(loader)
        pid = worker_pid("pipeloom-separate")
        assert next(iterator) == (0, 0)
        with pytest.raises(KeyError, match="bad sample") as info:
            list(iterator)
        del iterator
    origin = info.value.__cause__
    assert isinstance(origin, WorkerError)
    assert origin.worker == f"separate process for InOwnProcess() (pid {pid})"
    assert origin.block.startswith("Mapper(fn=explode_at_seven")
    assert (origin.item, origin.original_type) == (7, "KeyError")
    assert f"raised in separate process for InOwnProcess() (pid {pid}), block Mapper(" in str(
        info.value
    )
    leftovers.assert_none()


@pytest.mark.timeout(20)
def test_a_separate_process_killed_at_an_output_names_that_output(leftovers):
    side = InOwnProcess(IterableWrapper(range(30)).map(killed_at_13))
    pipe = IterableWrapper(range(30)).sharding_filter().zip(side)
    service = MultiProcessingReadingService(1, start_method="fork", timeout=30)
    with DataLoader(pipe, service, seed=0) as loader, pytest.raises(WorkerError) as info:
        list(loader)
    assert "was killed by signal 9 (SIGKILL)" in str(info.value)
    assert "It was making output 13 (counted from 0) of InOwnProcess() this epoch" in str(
        info.value
    )
    assert (info.value.block, info.value.item) == ("InOwnProcess()", 13)
    leftovers.assert_none()


@pytest.mark.timeout(20)
def test_the_separate_process_killed_while_the_main_waits_raises_naming_it(leftovers, monkeypatch):
    # The side stream is stuck on its first item, so the main process waits on it;
    # killing it must raise at once: never hang, never busy-wait on its sentinel.
    release = Release()
    stuck = functools.partial(pipelines.stuck_at, at=0, release_fd=release.fd)
    side = InOwnProcess(IterableWrapper(range(8)).map(stuck))
    pipe = IterableWrapper(range(8)).sharding_filter().zip(side)
    loader = DataLoader(pipe, MultiProcessingReadingService(2, start_method="fork"), seed=0)
    iterator = iter(loader)
    pid = worker_pid("pipeloom-separate")
    polls = test_lifecycle.count_calls(monkeypatch, SeparateProcessReader, "async_next")
    killer = threading.Timer(0.3, os.kill, (pid, signal.SIGKILL))
    killer.start()
    try:
        expected = (
            rf"separate process for InOwnProcess\(\) \(pid {pid}\) was killed by "
            rf"signal 9 \(SIGKILL\)"
        )
        with pytest.raises(WorkerError, match=expected) as info:
            list(iterator)
    finally:
        killer.join()
        release.set()
    assert polls[0] < 100, "busy-waited: the reader polled the process instead of sleeping"
    assert info.value.worker == f"separate process for InOwnProcess() (pid {pid})"
    assert info.value.block == "InOwnProcess()"
    loader.shutdown()
    del iterator, loader
    release.close()
    leftovers.assert_none()


# -- where a mark is refused -------------------------------------------------------------------


def made_by_workers() -> IterDataPipe:
    return IterableWrapper(range(8)).sharding_filter().map(abs).batch(2)


MISPLACED = {
    "reads-the-workers-output": (
        lambda: InOwnProcess(made_by_workers()),
        ValueError,
        r"InOwnProcess\(\) asks for a separate process, but it reads the workers' output",
    ),
    "in-the-replicated-part": (
        lambda: InOwnProcess(IterableWrapper(range(8))).sharding_filter().map(abs).batch(2),
        ValueError,
        r"InOwnProcess\(\) asks for a separate process, but it is in the part of the pipeline "
        r"that every worker replicates",
    ),
    "map-style": (
        lambda: Lookup(made_by_workers(), MarkedTable()),
        TypeError,
        r"only iterable blocks can run in a separate process, got MarkedTable\(\)",
    ),
}
# Each hint points to where a mark is accepted, not to the other refused place.
HINT = "mark a block on a branch that the workers neither run nor feed"


@pytest.mark.timeout(20)
@pytest.mark.parametrize("misplaced", MISPLACED.values(), ids=MISPLACED.keys())
@pytest.mark.parametrize(
    "make_service",
    [SERVICES[name] for name in ("processes-fork", "threads", "economic", "chunked")],
    ids=["processes", "threads", "economic", "chunked"],
)
def test_a_misplaced_mark_is_refused_with_its_reason(misplaced, make_service, leftovers):
    make_pipe, error, message = misplaced
    assert len(list(DataLoader(make_pipe(), seed=0))) == 4  # in-process the mark is ignored
    with pytest.raises(error, match=message) as info:
        DataLoader(make_pipe(), make_service(), seed=0)  # refused where the loader is built
    if error is ValueError:
        assert HINT in str(info.value)
    leftovers.assert_none()


# -- nothing left behind ------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_stopping_mid_epoch_and_garbage_collection_leave_nothing_behind(leftovers):
    expected = reference()
    loader = DataLoader(
        with_side_stream(), MultiProcessingReadingService(2, start_method="fork"), seed=5
    )
    for i, _ in enumerate(loader):
        if i == 1:
            break  # the side stream's process is mid-epoch
    assert without_pids(list(loader)) == expected[1]  # the next epoch starts afresh
    iterator = iter(loader)
    next(iterator)
    assert "pipeloom-separate" in [p.name for p in multiprocessing.active_children()]
    del iterator, loader  # no shutdown(): garbage collection stops everything
    leftovers.assert_none()


def test_a_copy_of_the_reader_is_refused_saying_what_needs_one_and_what_to_do():
    # a resume on another number of ranks copies the pipeline to find each rank's progress;
    # it was refused with "a SeparateProcessReader cannot be copied to another process"
    reader = SeparateProcessReader(IterableWrapper(range(3)), start_method="fork", prefetch=2)
    try:
        with pytest.raises(TypeError, match=r"another number of ranks .* same number of ranks"):
            pickle.dumps(reader)
    finally:
        reader.stop()
