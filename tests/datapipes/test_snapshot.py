"""snapshot: written once where items are made, read back as a sharded, resumable source."""

from __future__ import annotations

import multiprocessing
import os
import select
import shutil
import signal

import numpy as np
import pytest
import torch

import pipeloom
from pipeloom.datapipes import FileLister, IterableWrapper, Snapshot, UnfingerprintableError
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)
from pipeloom.testing import check_resume_from_every_step, collect


def square(x):
    return x * x


def jitter(x):
    return x + float(pipeloom.item_rng().random())


def build(path, n=24, **kwargs):
    """Source -> sharding point -> (filter, per-item work) -> snapshot -> random augmentation."""
    made = IterableWrapper(range(n)).sharding_filter().filter(lambda x: x % 5 != 3).map(square)
    return made.snapshot(path, **kwargs)


def augmented(path, **kwargs):
    return build(path, **kwargs).map(jitter)


def uncached_plain(n=24):
    return IterableWrapper(range(n)).sharding_filter().filter(lambda x: x % 5 != 3).map(square)


def epochs(pipe, service=None, count=2, seed=3):
    with pipeloom.DataLoader(pipe, service, seed=seed) as loader:
        return [list(loader) for _ in range(count)]


def identity(x):
    return x


def uncached(n=24):
    """The same pipeline with a pass-through where the snapshot is (seeds follow graph places)."""
    return uncached_plain(n).map(identity).map(jitter)


SERVICES = [None, ThreadReadingService(2), MultiProcessingReadingService(2)]
SERVICE_IDS = ["in-process", "threads", "processes"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("service", SERVICES, ids=SERVICE_IDS)
def test_output_equals_the_uncached_pipeline_in_every_epoch(tmp_path, service):
    reference = epochs(uncached(), count=3)
    assert epochs(augmented(tmp_path), service, count=3) == reference  # writes, then reads
    assert build(tmp_path).is_complete()
    assert epochs(augmented(tmp_path), service, count=3) == reference  # a new loader reads


@pytest.mark.timeout(120)
@pytest.mark.parametrize("writer", SERVICES, ids=SERVICE_IDS)
@pytest.mark.parametrize("reader", SERVICES, ids=SERVICE_IDS)
def test_written_by_any_service_read_by_any_other(tmp_path, writer, reader):
    reference = epochs(uncached())
    epochs(augmented(tmp_path), writer, count=1)
    assert epochs(augmented(tmp_path), reader) == reference


@pytest.mark.timeout(120)
def test_later_epochs_do_not_run_the_upstream(tmp_path):
    log = tmp_path / "calls"
    pipe = (
        IterableWrapper(range(10))
        .sharding_filter()
        .map(LoggedSquare(str(log)))
        .snapshot(tmp_path / "s")
    )
    with pipeloom.DataLoader(
        pipe, MultiProcessingReadingService(2, persistent_workers=True), seed=0
    ) as loader:
        assert list(loader) == [x * x for x in range(10)]
        calls_after_first = log.read_text()
        assert list(loader) == [x * x for x in range(10)]
        assert list(loader) == [x * x for x in range(10)]
    assert log.read_text() == calls_after_first and len(calls_after_first) == 10


class LoggedSquare:
    """Squares and appends a byte to a file per call (visible across processes)."""

    def __init__(self, log):
        self.log = log

    def __call__(self, x):
        with open(self.log, "a") as file:
            file.write("x")
        return x * x


@pytest.mark.timeout(120)
def test_read_with_another_number_of_workers_than_wrote_it(tmp_path):
    reference = epochs(uncached())
    epochs(augmented(tmp_path), MultiProcessingReadingService(2), count=1)
    assert epochs(augmented(tmp_path), MultiProcessingReadingService(3)) == reference
    assert epochs(augmented(tmp_path), ThreadReadingService(4)) == reference


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["economic", "chunked"])
def test_economic_and_chunked_read_a_snapshot_but_do_not_write_one(tmp_path, strategy):
    def pipe(snapshot=True):
        made = IterableWrapper(range(24)).sharding_filter().map(square)
        made = made.snapshot(tmp_path) if snapshot else made.map(identity)
        return made.map(jitter).batch(4)

    reference = epochs(pipe(snapshot=False))
    service = MultiProcessingReadingService(2, strategy=strategy)
    assert epochs(pipe(), service) == reference
    assert not os.listdir(tmp_path)  # item workers see tasks, not the epoch: they do not write
    epochs(pipe(), count=1)
    assert epochs(pipe(), service) == reference


def test_resume_from_every_step_while_writing(tmp_path):
    def make():
        shutil.rmtree(tmp_path, ignore_errors=True)
        return augmented(tmp_path)

    check_resume_from_every_step(make, seed=5)


def test_resume_from_every_step_while_reading(tmp_path):
    collect(augmented(tmp_path), seed=5)
    check_resume_from_every_step(lambda: augmented(tmp_path), seed=5, epoch=2)


def test_a_resumed_writing_epoch_does_not_commit_and_the_next_full_one_does(tmp_path):
    pipe = build(tmp_path)
    with pipeloom.DataLoader(pipe, seed=0) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(5)]
        state = loader.state_dict()
    resumed = pipeloom.DataLoader(build(tmp_path), seed=0)
    resumed.load_state_dict(state)
    assert head + list(resumed) == collect(uncached_plain())
    assert not build(tmp_path).is_complete()
    assert list(resumed) == collect(uncached_plain())
    assert build(tmp_path).is_complete()
    resumed.shutdown()


@pytest.mark.timeout(120)
def test_a_resumed_writing_epoch_in_workers_does_not_commit(tmp_path):
    service = MultiProcessingReadingService(2)
    with pipeloom.DataLoader(build(tmp_path), service, seed=0) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(5)]
        state = loader.state_dict()
    with pipeloom.DataLoader(build(tmp_path), MultiProcessingReadingService(2), seed=0) as resumed:
        resumed.load_state_dict(state)
        assert head + list(resumed) == collect(uncached_plain())
        assert not build(tmp_path).is_complete()
        assert list(resumed) == collect(uncached_plain())
    assert build(tmp_path).is_complete()


def twice(x):
    return [x, -x]


def test_resume_from_every_step_inside_a_position_with_several_items(tmp_path):
    def make():
        return (
            IterableWrapper(range(6))
            .sharding_filter()
            .flatmap(twice)
            .snapshot(tmp_path)
            .map(jitter)
        )

    collect(make(), seed=1)
    check_resume_from_every_step(make, seed=1, epoch=1)


def several_per_position(path=None):
    """Three outputs per source item (as a tar shard's samples), then random augmentation."""
    made = IterableWrapper(range(8)).sharding_filter().flatmap(lambda x: [x, x, x])
    made = made.snapshot(path) if path is not None else made.map(identity)
    return made.map(jitter)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("service", SERVICES, ids=SERVICE_IDS)
def test_outputs_of_one_position_replay_with_their_own_item_rng(tmp_path, service):
    """Output j of position p is replayed as (p, j): its draws are the live item's, and the
    outputs of one position do not all draw the same (they did when only p was kept)."""
    reference = epochs(several_per_position(), count=2)
    assert len({value for value in reference[0] if int(value) == 0}) == 3
    assert epochs(several_per_position(tmp_path), service, count=2) == reference  # writes, reads
    assert epochs(several_per_position(tmp_path), service, count=2) == reference  # a new loader


def rank_service(kind, rank):
    service = (
        InProcessReadingService() if kind == "in-process" else MultiProcessingReadingService(2)
    )
    service.set_outer_sharding(2, rank)
    return service


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["in-process", "processes"])
def test_each_rank_reads_its_share_and_one_rank_alone_does_not_write(tmp_path, kind):
    for rank in (0, 1):
        assert epochs(augmented(tmp_path), rank_service(kind, rank), count=1) == epochs(
            uncached(), rank_service(kind, rank), count=1
        )
    assert not build(tmp_path).is_complete()  # each rank saw only half the positions
    epochs(augmented(tmp_path), count=1)
    for rank in (0, 1):
        assert epochs(augmented(tmp_path), rank_service(kind, rank)) == epochs(
            uncached(), rank_service(kind, rank)
        )


def test_a_rank_that_saw_no_position_does_not_commit_an_empty_snapshot(tmp_path):
    """Seeing no position proves nothing (a rank's empty share, or the empty rest of an epoch
    resumed there): it committed a snapshot of no records, and every reader after it raised
    'covers positions 0..-1 ... the upstream changed' (fuzzer seed 700563)."""

    def one_item():
        return IterableWrapper(range(1)).sharding_filter().snapshot(tmp_path)

    assert epochs(one_item(), rank_service("in-process", 1), count=1) == [[]]
    assert not one_item().is_complete()
    assert epochs(one_item(), count=2) == [[0], [0]]  # the whole epoch writes it, then reads it
    assert one_item().is_complete()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["in-process", "processes"])
def test_a_rank_whose_share_is_the_first_positions_does_not_commit(tmp_path, kind):
    """Rank 0 of 2 over 3 positions in groups of 2 sees positions 0 and 1, "every position
    from 0 on": it committed them as the whole epoch, and a whole epoch then read 2 of its 3
    items back, or raised 'covers positions 0..1' (fuzzer seed 761418)."""

    def three_items():
        point = IterableWrapper(range(3)).sharding_filter()
        return point.map(lambda x: x * 10).batch(2).snapshot(tmp_path)

    assert epochs(three_items(), rank_service(kind, 0), count=1) == [[[0, 10]]]
    assert not three_items().is_complete()
    assert epochs(three_items(), count=2) == [[[0, 10], [20]], [[0, 10], [20]]]
    assert three_items().is_complete()


@pytest.mark.timeout(120)
def test_an_abandoned_writing_epoch_replayed_commits_only_fresh_shards(tmp_path):
    with pipeloom.DataLoader(build(tmp_path), MultiProcessingReadingService(2), seed=0) as loader:
        iterator = iter(loader)
        [next(iterator) for _ in range(3)]
        loader.set_epoch(0)  # the same epoch again: the same pass directory
        assert list(loader) == collect(uncached_plain())
    assert build(tmp_path).is_complete()
    assert epochs(augmented(tmp_path), ThreadReadingService(3)) == epochs(uncached())


# -- invalidation -------------------------------------------------------------------
def test_a_changed_function_makes_a_new_snapshot_and_says_what_changed(tmp_path):
    collect(IterableWrapper(range(5)).map(lambda x: x + 1).snapshot(tmp_path))
    with pytest.warns(UserWarning, match=r"made from a different upstream \(#0 Mapper"):
        changed = IterableWrapper(range(5)).map(lambda x: x + 2).snapshot(tmp_path)
    assert collect(changed) == [2, 3, 4, 5, 6]
    assert len([d for d in os.listdir(tmp_path) if not d.startswith(".")]) == 2


def test_a_rewritten_input_file_makes_a_new_snapshot(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("one\ntwo\n")

    def pipe():
        return (
            FileLister(str(data), "*.txt")
            .open_files()
            .readlines(return_path=False)
            .snapshot(tmp_path / "s")
        )

    assert collect(pipe()) == ["one", "two"]
    (data / "a.txt").write_text("three\n")
    os.utime(data / "a.txt", ns=(1, 1))  # a new mtime whatever the clock's resolution
    with pytest.warns(UserWarning, match="made from a different upstream"):
        fresh = pipe()
    assert collect(fresh) == ["three"]


def test_the_same_pipeline_built_again_reuses_the_snapshot(tmp_path):
    first = build(tmp_path)
    collect(first)
    again = build(tmp_path)
    assert again.directory == first.directory and again.is_complete()


def test_an_explicit_key_replaces_the_fingerprint(tmp_path):
    collect(IterableWrapper(range(3)).snapshot(tmp_path, key="v1"))
    other = IterableWrapper(range(3)).map(square).snapshot(tmp_path, key="v1")
    assert other.is_complete() and collect(other) == [0, 1, 2]  # your key, your promise


# -- randomness ---------------------------------------------------------------------
def test_a_shuffle_upstream_is_refused_unless_allowed(tmp_path):
    with pytest.raises(ValueError, match=r"freeze the randomness of Shuffler.*allow_random=True"):
        IterableWrapper(range(5)).shuffle().snapshot(tmp_path)
    frozen = IterableWrapper(range(5)).shuffle().snapshot(tmp_path, allow_random=True)
    assert sorted(collect(frozen, epoch=0)) == list(range(5))
    assert collect(frozen, epoch=1) == collect(frozen, epoch=0)


def test_item_rng_upstream_is_refused_at_the_first_item(tmp_path):
    pipe = IterableWrapper(range(5)).map(jitter).snapshot(tmp_path)
    with pytest.raises(RuntimeError, match=r"drew from item_rng\(\) upstream.*allow_random=True"):
        collect(pipe)
    assert not pipe.is_complete()


# -- crashes --------------------------------------------------------------------------
class Stall:
    """Squares; at ``at`` tells the parent through ``ready`` and blocks reading ``hold``."""

    def __init__(self, at, ready, hold):
        self.at, self.ready, self.hold = at, ready, hold

    def __call__(self, x):
        if x == self.at:
            os.write(self.ready, b"!")
            os.read(self.hold, 1)
        return x * x


def write_until_killed(path, ready, hold):
    list(
        IterableWrapper(range(40))
        .sharding_filter()
        .map(Stall(20, ready, hold))
        .snapshot(path, key="k")
    )


@pytest.mark.timeout(120)
def test_a_writer_killed_mid_snapshot_leaves_nothing_a_later_run_reads(tmp_path):
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    job = multiprocessing.get_context("fork").Process(
        target=write_until_killed, args=(str(tmp_path), ready_w, hold_r)
    )
    job.start()
    assert select.select([ready_r], [], [], 60)[0], "the writer never reached the middle"
    os.kill(job.pid, signal.SIGKILL)
    job.join(30)
    for fd in (ready_r, ready_w, hold_r, hold_w):
        os.close(fd)
    pipe = IterableWrapper(range(40)).sharding_filter().map(square).snapshot(tmp_path, key="k")
    assert not pipe.is_complete()
    assert any(name.startswith(".tmp-") for name in os.listdir(tmp_path))  # the half-written one
    assert collect(pipe) == [x * x for x in range(40)]
    assert pipe.is_complete()
    assert not any(name.startswith(".tmp-") for name in os.listdir(tmp_path))  # swept


class DieAt:
    def __init__(self, at):
        self.at = at

    def __call__(self, x):
        if x == self.at:
            os.kill(os.getpid(), signal.SIGKILL)
        return x * x


@pytest.mark.timeout(120)
def test_a_worker_killed_while_writing_its_shard_leaves_no_snapshot(tmp_path):
    dying = IterableWrapper(range(30)).sharding_filter().map(DieAt(17)).snapshot(tmp_path, key="k")
    with pipeloom.DataLoader(dying, MultiProcessingReadingService(2), seed=0) as loader:
        with pytest.raises(pipeloom.WorkerError, match="SIGKILL"):
            list(loader)
    healthy = IterableWrapper(range(30)).sharding_filter().map(square).snapshot(tmp_path, key="k")
    assert not healthy.is_complete()
    assert epochs(healthy, ThreadReadingService(2), count=1) == [[x * x for x in range(30)]]
    assert healthy.is_complete()


# -- storage ----------------------------------------------------------------------------
def image(i):
    return {
        "image": torch.full((3, 64, 64), i, dtype=torch.uint8),
        "array": np.arange(4) * i,
        "i": i,
    }


def test_tensors_and_arrays_are_stored_compactly_in_bounded_files(tmp_path):
    pipe = IterableWrapper(range(200)).map(image).snapshot(tmp_path, shard_size=1)
    first = collect(pipe)
    again = collect(pipe)
    for a, b in zip(first, again):
        assert torch.equal(a["image"], b["image"]) and np.array_equal(a["array"], b["array"])
        assert a["i"] == b["i"]
    files = [f for f in os.listdir(pipe.directory) if f.endswith(".rec")]
    sizes = [os.path.getsize(os.path.join(pipe.directory, f)) for f in files]
    assert len(files) > 1 and max(sizes) <= 1 << 20
    assert sum(sizes) < 200 * (3 * 64 * 64 + 1200)  # the pixels, plus little per item


def test_replayed_tensors_are_writable_and_own_their_memory(tmp_path):
    pipe = IterableWrapper(range(3)).map(image).snapshot(tmp_path)
    collect(pipe)
    item = collect(pipe)[1]
    item["image"] += 1  # no read-only warning, no shared buffer surprise
    assert int(item["image"][0, 0, 0]) == 2


# -- bad arguments ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"path": 3}, TypeError, r"path must be a directory path, got int 3"),
        ({"shard_size": 0}, ValueError, r"shard_size must be an int >= 1 \(MiB per file\), got 0"),
        ({"key": ""}, TypeError, r"key must be a non-empty str"),
    ],
)
def test_bad_arguments_say_what_was_expected(tmp_path, kwargs, error, message):
    kwargs = {"path": tmp_path, **kwargs}
    with pytest.raises(error, match=message):
        Snapshot(IterableWrapper(range(3)), **kwargs)


class Opaque:
    __slots__ = ()


def test_an_upstream_value_without_identity_asks_for_a_key(tmp_path):
    thing = Opaque()
    with pytest.raises(UnfingerprintableError, match=r"Mapper.*closure variable 'thing'.*key="):
        IterableWrapper(range(3)).map(lambda x: (thing, x)).snapshot(tmp_path)
    assert collect(IterableWrapper(range(3)).map(lambda x: x).snapshot(tmp_path, key="mine")) == [
        0,
        1,
        2,
    ]
