"""Warm start (issue #16 goal 5): the first outputs come from threads of the main process
while the worker processes start; the epoch then moves to them, nothing repeated or dropped."""

from __future__ import annotations

import io
import itertools
import os
import tarfile
import threading
import time

import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import FileLister, IterableWrapper, IterDataPipe, item_rng
from pipeloom.reading_service import MultiProcessingReadingService
from tests.fuzzing.recipes import GeneratorSourceNoState
from tests.own_resources import OwnResources

pytestmark = pytest.mark.timeout(180)  # spawned workers import torch: slow on a busy machine

MAIN = os.getpid()
ENDLESS = 10**7  # sources long enough that the processes are up before their end


def made_where(x):
    """The item, a draw from its own RNG, and the process that made it (after ~1 ms of work)."""
    time.sleep(0.001)  # the item's work: the threads make ~2,000 items/s, not millions
    return (x, int(item_rng().integers(1 << 30)), os.getpid())


def not_one_in_three(item):
    return item[0] % 3 != 1


def warm(workers: int = 2, **options) -> MultiProcessingReadingService:
    return MultiProcessingReadingService(workers, start_method="spawn", warm_start=True, **options)


def plain(batches):
    """Batches without the pid that made each item (it differs between services)."""
    return [[item[:2] for item in batch] for batch in batches]


def reference(pipe, count: int, seed: int = 7):
    with DataLoader(pipe, seed=seed) as loader:
        return plain(itertools.islice(loader, count))


def until_processes_made(iterator, extra: int = 5):
    """Batches from ``iterator`` up to ``extra`` batches after the first one made in a worker."""
    taken, after = [], None
    for batch in iterator:
        taken.append(batch)
        if after is None and any(item[2] != MAIN for item in batch):
            after = len(taken)
        if after is not None and len(taken) >= after + extra:
            return taken, after
    raise AssertionError(f"the epoch ended in the threads after {len(taken)} batches")


def epochs_until_one_in_the_processes(loader, in_process, compared) -> None:
    """Epochs of ``loader`` until one runs in the worker processes; each must run wholly in
    the threads or in the processes, and equal the in-process one as ``compared`` shows it.
    They are taken back to back (the reference after), so the processes come up during
    an epoch, not in a pause between two."""
    epochs = []
    while not epochs or any(item[2] == MAIN for batch in epochs[-1] for item in batch):
        assert len(epochs) < 200, "no epoch ran in the worker processes"
        epochs.append(list(loader))
    for number, batches in enumerate(epochs):
        in_threads = {item[2] == MAIN for batch in batches for item in batch}
        assert len(in_threads) == 1, f"epoch {number} was split between threads and processes"
        assert compared(batches) == compared(in_process), f"epoch {number}"


def endless(step=None):
    pipe = IterableWrapper(range(ENDLESS)).sharding_filter().map(made_where)
    return (pipe if step is None else step(pipe)).batch(4)


@pytest.mark.parametrize("shape", ["items", "filtered"])
def test_the_epoch_moves_to_the_processes_without_repeating_or_dropping(shape):
    # "filtered": the processes build whole batches (a filter before batch), the threads
    # merge items: the threads' checkpoint is translated at the move.
    step = None if shape == "items" else (lambda pipe: pipe.filter(not_one_in_three))
    with DataLoader(endless(step), warm(), seed=7) as loader:
        taken, first_in_worker = until_processes_made(iter(loader))
    assert first_in_worker > 1, "the first batch was not made in the main process"
    assert all(item[2] == MAIN for batch in taken[: first_in_worker - 1] for item in batch)
    assert all(item[2] != MAIN for batch in taken[first_in_worker:] for item in batch)
    assert plain(taken) == reference(endless(step), len(taken))


def same_item(item):
    return item


def test_a_block_reading_ahead_of_the_batches_moves_only_where_no_batch_is_begun():
    # threadpool_map after batch reads batches ahead, so at most outputs the threads'
    # batch holds items of the next batch, which the processes (building whole batches)
    # cannot take over: the move waits for an output where none is begun, or the next
    # epoch. It raised StateOfAnotherService mid-epoch (found by forcing moves at random
    # outputs); every epoch must still be the in-process one.
    def pipe():
        items = IterableWrapper(range(600)).sharding_filter().map(made_where)  # ~0.3 s
        batches = items.filter(not_one_in_three).batch(4)
        return batches.threadpool_map(same_item, max_workers=1)

    epochs = []  # taken back to back: the processes come up during one, not between two
    with DataLoader(pipe(), warm(), seed=7) as loader:
        while not epochs or epochs[-1][0][0][2] == MAIN:  # till one starts in the processes
            assert len(epochs) < 200, "no epoch ran in the worker processes"
            epochs.append(list(loader))
    with DataLoader(pipe(), seed=7) as in_process:
        for number, batches in enumerate(epochs):
            assert plain(batches) == plain(in_process), f"epoch {number}"


def member_made_where(member):
    """A tar member's number, a draw, and the process that read it (after ~1 ms of work)."""
    _path, data = member  # load_from_tar gives a member's bytes
    return made_where(int(data))


def tar_shards(root, shards: int = 4, members: int = 7) -> None:
    for shard in range(shards):
        with tarfile.open(root / f"shard{shard}.tar", "w") as tar:
            for number in range(shard * members, (shard + 1) * members):
                data = str(number).encode()
                info = tarfile.TarInfo(f"s{number:04d}.num")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_a_move_inside_a_tar_shard_delivers_its_members_once(tmp_path):
    # Several outputs share one position (a shard's members) and batches straddle shards:
    # the move lands inside a shard, whose delivered members the processes skip.
    tar_shards(tmp_path)

    def pipe():
        paths = FileLister(str(tmp_path), "*.tar").cycle()  # endless: the move comes
        members = paths.sharding_filter().open_files("rb").load_from_tar()
        return members.map(member_made_where).batch(3)

    with DataLoader(pipe(), warm(), seed=7) as loader:
        taken, _ = until_processes_made(iter(loader))
    with DataLoader(pipe(), seed=7) as in_process:
        assert plain(taken) == plain(itertools.islice(in_process, len(taken)))


@pytest.mark.parametrize("when", ["in the threads", "after the move"])
def test_a_checkpoint_resumes_exactly(when):
    pipe = endless()
    with DataLoader(pipe, warm(), seed=7) as loader:
        iterator = iter(loader)
        if when == "in the threads":
            taken = [next(iterator), next(iterator)]
        else:
            taken, _ = until_processes_made(iterator)
        state = loader.state_dict()
    services = [warm(), MultiProcessingReadingService(3, start_method="fork"), None]
    for service in services:
        with DataLoader(endless(), service, seed=7) as resumed:
            resumed.load_state_dict(state)
            rest = list(itertools.islice(resumed, 6))
        assert plain(taken + rest) == reference(endless(), len(taken) + 6), service


class Passing(IterDataPipe):
    """A user's block with a plain ``__iter__`` and no ``state_dict()``."""

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        yield from self.source


def test_an_epoch_that_cannot_be_saved_mid_epoch_moves_at_the_next_one():
    # A block of the main process's part without state_dict(): the threads' epoch has no
    # checkpoint to move from, so it ends in the threads; a later epoch starts in the
    # processes. (A worker's part needs none: a resume replays it from the position.)
    def pipe():
        return Passing(IterableWrapper(range(40)).sharding_filter().map(made_where).batch(4))

    with DataLoader(pipe(), seed=3) as in_process, DataLoader(pipe(), warm(), seed=3) as loader:
        epochs_until_one_in_the_processes(loader, in_process, plain)


def test_a_source_without_state_moves_mid_epoch_by_replaying_to_the_position():
    pipe = GeneratorSourceNoState(ENDLESS).sharding_filter().map(made_where).batch(4)
    with DataLoader(pipe, warm(), seed=3) as loader:
        taken, _ = until_processes_made(iter(loader))
    again = GeneratorSourceNoState(ENDLESS).sharding_filter().map(made_where).batch(4)
    assert plain(taken) == reference(again, len(taken), seed=3)


def test_shutdown_while_the_processes_start_leaves_nothing_behind():
    before = OwnResources()
    loader = DataLoader(endless(), warm(), seed=7)
    assert next(iter(loader))[0][2] == MAIN
    loader.shutdown()  # joins the start under way, then stops its processes
    before.assert_released(timeout=30)


def test_a_pipeline_that_cannot_be_pickled_raises_at_the_move():
    lock = threading.Lock()  # cannot be pickled: the processes can never start

    def holds_a_lock(item):
        with lock:
            return item

    pipe = IterableWrapper(range(ENDLESS)).sharding_filter().map(made_where).map(holds_a_lock)
    with DataLoader(pipe.batch(4), warm(), seed=7) as loader:
        iterator = iter(loader)
        assert next(iterator)  # from the threads
        with pytest.raises(TypeError, match="cannot be sent to worker processes"):
            for _ in iterator:
                pass


def test_under_fork_the_workers_make_every_batch():
    service = MultiProcessingReadingService(2, start_method="fork", warm_start=True)
    pipe = IterableWrapper(range(24)).sharding_filter().map(made_where).batch(4)
    with DataLoader(pipe, service, seed=7) as loader:
        batches = list(loader)
    assert all(item[2] != MAIN for batch in batches for item in batch)
    assert plain(batches) == plain(DataLoader(pipe, seed=7))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"strategy": "economic"}, "only applies to strategy='classic'"),
        ({"strategy": "chunked"}, "only applies to strategy='classic'"),
        ({"worker_init_fn": print}, "cannot run worker_init_fn"),
    ],
)
def test_warm_start_refuses_what_it_cannot_do(options, message):
    with pytest.raises(ValueError, match=message):
        MultiProcessingReadingService(2, warm_start=True, **options)


def test_warm_start_must_be_a_bool():
    with pytest.raises(TypeError, match="warm_start"):
        MultiProcessingReadingService(2, warm_start="yes")


def test_an_epoch_left_in_the_threads_then_a_whole_epoch():
    with DataLoader(endless(), warm(persistent_workers=True), seed=7) as loader:
        first = next(iter(loader))  # the iterator is dropped: that epoch is abandoned
        taken, _ = until_processes_made(iter(loader))
        loader.set_epoch(0)
        again, _ = until_processes_made(iter(loader))
    assert first[0][2] == MAIN
    with DataLoader(endless(), seed=7) as in_process:
        in_process.set_epoch(1)
        second = plain(itertools.islice(in_process, len(taken)))
    assert plain(taken) == second
    assert plain(again) == reference(endless(), len(again))


def test_in_arrival_order_an_epoch_stays_where_it_started():
    # in_order=False cannot checkpoint (arrival order cannot be replayed): no move mid-epoch
    def pipe():
        return IterableWrapper(range(200)).sharding_filter().map(made_where).batch(4)

    def items(batches):
        return sorted(item for batch in plain(batches) for item in batch)

    service = warm(in_order=False, persistent_workers=True)
    with DataLoader(pipe(), seed=7) as in_process, DataLoader(pipe(), service, seed=7) as loader:
        epochs_until_one_in_the_processes(loader, in_process, items)
