"""A loader dropped without ``shutdown()`` stops by reference counting alone (#14 items 1-3).

With the garbage collector disabled, dropping the last reference to a loader
(and to its iterator) mid-epoch must leave no worker process, thread, fd or
memfd of this test's process tree. On failure, the message names the
reference cycle that kept the loader alive (``tests/own_resources.py``).
"""

from __future__ import annotations

import gc
import itertools
import subprocess
import sys
import textwrap

import pytest
import torch.utils.data

import pipeloom.compat
from pipeloom import DataLoader
from pipeloom.datapipes import FileLister, IterableWrapper
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from tests.own_resources import OwnResources, cycles_left_by, dropped, memfds, open_fds
from tests.reading_service import pipelines
from tests.reading_service.test_separate import with_side_stream


class Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> int:
        return index * index


LOADERS = {
    "threads": lambda: DataLoader(pipelines.for_strategies(40), ThreadReadingService(2), seed=1),
    "classic-fork": lambda: DataLoader(
        pipelines.for_strategies(40), MultiProcessingReadingService(2, start_method="fork"), seed=1
    ),
    "classic-spawn": lambda: DataLoader(
        pipelines.for_strategies(40), MultiProcessingReadingService(2, start_method="spawn"), seed=1
    ),
    "classic-warm-start": lambda: DataLoader(
        pipelines.for_strategies(4000),
        MultiProcessingReadingService(2, start_method="spawn", warm_start=True),
        seed=1,
    ),
    "classic-persistent": lambda: DataLoader(
        pipelines.for_strategies(40),
        MultiProcessingReadingService(2, persistent_workers=True),
        seed=1,
    ),
    "economic": lambda: DataLoader(
        pipelines.for_strategies(40, map_style=True),
        MultiProcessingReadingService(2, strategy="economic"),
        seed=1,
    ),
    "chunked": lambda: DataLoader(
        pipelines.for_strategies(40), MultiProcessingReadingService(2, strategy="chunked"), seed=1
    ),
    "separate-process": lambda: DataLoader(
        with_side_stream(), MultiProcessingReadingService(2, start_method="fork"), seed=5
    ),
    "compat": lambda: pipeloom.compat.DataLoader(Squares(), batch_size=2, num_workers=2),
    "compat-persistent": lambda: pipeloom.compat.DataLoader(
        Squares(), batch_size=2, num_workers=2, persistent_workers=True
    ),
}


def _failure(left, cycles) -> str:
    return f"left behind: {left}; reference cycles (these keep it alive): {cycles}"


@pytest.mark.timeout(300)  # a hang detector: spawned workers import torch, slow on a busy machine
@pytest.mark.parametrize("keep_iterator", [False, True], ids=["iterator-dropped-first", "both"])
@pytest.mark.parametrize("name", list(LOADERS))
def test_a_loader_dropped_mid_epoch_stops_without_the_garbage_collector(name, keep_iterator):
    def abandon() -> None:
        loader = LOADERS[name]()
        iterator = iter(loader)
        next(iterator)
        if not keep_iterator:  # an older epoch's iterator dropped, a newer one mid-epoch
            del iterator
            iterator = iter(loader)
            next(iterator)
        in_threads = name in ("threads", "classic-warm-start")  # (warm: its first outputs)
        assert memfds() or in_threads or name.startswith("compat")
        del loader, iterator  # no shutdown(), no gc.collect()

    left, cycles = dropped(abandon)
    assert not left, _failure(left, cycles)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "name", ["threads", "classic-fork", "classic-warm-start", "economic", "compat"]
)
def test_a_dropped_loader_leaves_no_reference_cycle_of_its_own(name):
    def abandon() -> None:
        loader = LOADERS[name]()
        iterator = iter(loader)
        next(iterator)
        del loader, iterator

    prefixes = ("pipeloom.loader", "pipeloom.reading_service", "pipeloom.queues", "pipeloom.compat")
    assert cycles_left_by(abandon, module_prefix=prefixes) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["iter-again", "dropped"])
def test_a_prefetch_over_an_abandoned_epoch_leaves_no_reference_cycle(how):
    # The prefetch thread reads the worker threads' queues; closing them at the
    # epoch's end raises QueueClosed there, which the prefetch kept (unread) with
    # its traceback: the thread's frames, and through them the prefetch's state.
    def abandon() -> None:
        pipe = IterableWrapper(range(40)).sharding_filter().prefetch(4).map(pipelines.draw)
        _stop_early(DataLoader(pipe, ThreadReadingService(2), seed=1), how)

    prefixes = ("pipeloom.datapipes", "pipeloom.reading_service", "pipeloom.queues")
    assert cycles_left_by(abandon, module_prefix=prefixes) == []


@pytest.mark.timeout(60)
def test_classic_shutdown_gives_back_every_fd_without_a_collection():
    gc.collect()
    before = OwnResources()
    gc.disable()
    try:
        for _ in range(10):
            loader = DataLoader(
                pipelines.for_strategies(16), MultiProcessingReadingService(2), seed=1
            )
            assert len(list(loader)) == 4
            loader.shutdown()
        del loader
        left = before.left_after(timeout=10)
    finally:
        gc.enable()
    assert not left, f"after shutdown(): {left}"


def _stop_early(loader, how: str) -> None:
    iterator = iter(loader)
    next(iterator)
    if how == "shutdown":
        loader.shutdown()
    elif how == "iter-again":
        next(iter(loader))  # the older epoch's iterator stays alive, stopped
        loader.shutdown()
    # "dropped": no shutdown(); the caller drops the loader and this iterator


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["shutdown", "iter-again", "dropped"])
@pytest.mark.parametrize("threads", [0, 2], ids=["in-process", "threads"])
def test_an_epoch_stopped_early_closes_its_files_without_the_garbage_collector(
    tmp_path, threads, how
):
    for name in ("a", "b"):
        (tmp_path / f"{name}.txt").write_text("line\n" * 50)
    gc.collect()
    gc.disable()
    try:
        for _ in range(5):  # a long job builds a loader per epoch, or per evaluation
            pipe = FileLister(str(tmp_path), "*.txt").sharding_filter().open_files("r")
            service = ThreadReadingService(threads) if threads else None
            _stop_early(DataLoader(pipe.readlines(), service, seed=0), how)
            # A block's generator keeps the pipeline in a reference cycle: only closing
            # the streams when the epoch stops gives the files back before a collection.
            still_open = [t for t in open_fds().values() if t.startswith(str(tmp_path))]
            assert still_open == [], f"{how}: files open after the epoch stopped: {still_open}"
    finally:
        gc.enable()


SOAK = textwrap.dedent(
    """
    import gc
    from pipeloom import DataLoader
    from pipeloom.reading_service import MultiProcessingReadingService
    from tests.reading_service import pipelines

    kept = []  # abandoned loaders a later fork inherits, freed by its garbage collector
    for cycle in range({cycles}):
        strategy = ("classic", "economic", "chunked")[cycle % 3]
        loader = DataLoader(
            pipelines.for_strategies(12, map_style=strategy == "economic"),
            MultiProcessingReadingService(2, strategy=strategy, start_method="fork"),
            seed=cycle,
        )
        iterator = iter(loader)
        next(iterator)
        if cycle % 2:
            kept.append((loader, iterator))  # alive while the next loaders fork
        if len(kept) > 3:
            kept.pop(0)
        del loader, iterator
        if cycle % 5 == 0:
            gc.collect()
    kept.clear()
    gc.collect()
    print("done")
    """
)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("cycles", [60, pytest.param(300, marks=pytest.mark.slow)])
def test_forked_workers_never_act_on_their_parents_abandoned_loaders(cycles):
    result = subprocess.run(
        [sys.executable, "-c", SOAK.format(cycles=cycles)],
        capture_output=True,
        text=True,
        timeout=580,
        check=False,
    )
    assert result.stdout.strip() == "done", result.stderr[-3000:]
    assert result.stderr == ""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("threads", [0, 2], ids=["in-process", "threads"])
def test_letting_go_of_a_one_shot_source_mid_epoch_raises_nothing(threads):
    # Closing what an abandoned epoch holds restarts its blocks; a one-shot iterator
    # cannot start over, which only a next epoch over it should be told.
    def loader(pipe):
        return DataLoader(pipe, ThreadReadingService(threads)) if threads else DataLoader(pipe)

    stopped = loader(IterableWrapper(itertools.count()).sharding_filter())
    iterator = iter(stopped)
    assert [next(iterator), next(iterator)] == [0, 1]
    stopped.shutdown()
    endless = loader(IterableWrapper(itertools.count()).sharding_filter().header(6))
    assert sorted(endless) == list(range(6))
    endless.shutdown()
