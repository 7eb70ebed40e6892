"""Classic workers build whole batches also when the per-item blocks drop or multiply items.

File openers, tar readers, ``webdataset``, ``filter`` and ``flatmap`` between
the sharding point and ``batch``: the workers pass the items that do not fill
a batch on to the next run's worker (``strategies/classic/assemble.py``), so
the main process receives whole batches, identical to in-process ones.
"""

from __future__ import annotations

import io
import os
import pickle
import signal
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader, item_rng
from pipeloom.datapipes import FileLister, IterableWrapper
from pipeloom.errors import WorkerError
from pipeloom.reading_service import MultiProcessingReadingService
from pipeloom.testing import check_same_output_everywhere
from tests.reading_service.random_pipelines import batched, build, recipes

pytestmark = pytest.mark.timeout(180)


def classic(workers: int, **options):
    return MultiProcessingReadingService(workers, timeout=60, **options)


def draw(x):
    return x, int(item_rng().integers(1_000_000))


def three_or_none(x):
    return [x, x * 10, x * 100] if x % 4 else []


def not_multiple_of_3(x):
    return x % 3 != 0


def flatmap_and_filter():
    return (
        IterableWrapper(range(40))
        .shuffle()
        .sharding_filter()
        .flatmap(three_or_none)
        .filter(not_multiple_of_3)
        .map(draw)
        .batch(5)
        .collate()
    )


def read(path_and_stream):
    path, stream = path_and_stream
    with stream:
        return os.path.basename(path), stream.read(), int(item_rng().integers(1000))


@pytest.fixture
def files(tmp_path):
    """Files ``f00``..``f29``; the paths listed include 5 removed after listing."""
    for i in range(30):
        (tmp_path / f"f{i:02d}.bin").write_bytes(bytes([i]) * 3)
    return tmp_path


def open_files_that_skip(root):
    def make():
        return (
            FileLister(str(root), "*.bin")
            .shuffle()
            .sharding_filter()
            .open_files("rb")
            .filter(lambda pair: not pair[0].endswith(("3.bin", "7.bin")))  # drops some
            .map(read)
            .batch(4)
            .collate()
        )

    return make


@pytest.fixture
def shards(tmp_path):
    for shard in range(5):
        with tarfile.open(tmp_path / f"shard-{shard}.tar", "w") as tar:
            for number in range(shard * 7, shard * 7 + 3 + shard * 2):  # 3..11 samples
                for ext, data in (("num", str(number).encode()), ("txt", b"x" * number)):
                    info = tarfile.TarInfo(f"s{number:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return tmp_path


def decode_sample(sample):
    return int(sample["num"]), len(sample["txt"]), int(item_rng().integers(1000))


def webdataset_pipe(root, batch_size=4):
    def make():
        return (
            FileLister(str(root), "*.tar")
            .shuffle()
            .sharding_filter()
            .open_files("rb")
            .load_from_tar()
            .webdataset()
            .map(decode_sample)
            .batch(batch_size)
            .collate()
        )

    return make


def members_pipe(root):
    def make():
        return (
            FileLister(str(root), "*.tar")
            .sharding_filter()
            .open_files("rb")
            .load_from_tar()
            .map(lambda member: (os.path.basename(member[0]), member[1]))
            .batch(3)
        )

    return make


def test_the_placement_shows_batch_and_collate_in_the_workers(shards):
    with DataLoader(webdataset_pipe(shards)(), classic(2), seed=0) as loader:
        placement = loader.placement()
        text = str(placement)
        workers_line = next(line for line in text.splitlines() if line.startswith("worker"))
        assert workers_line.startswith("worker processes x2: Collator(")
        assert "Batcher(batch_size=4" in workers_line
        assert "main process: Collator" not in text
        assert "passes the items that do not fill one on" in text
        assert len(list(loader)) == 9  # 35 samples in batches of 4


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_flatmap_and_filter_give_the_in_process_batches(workers):
    ran = check_same_output_everywhere(flatmap_and_filter, workers=workers, epochs=2)
    assert "classic" in ran


def identity(x):
    return x


@pytest.mark.parametrize("workers", [1, 2])
def test_a_threadpool_map_after_the_batch_gets_every_batch(workers):
    # It reads ahead: run in a worker, fed one batch at a time, it found the feed's end
    # after the first batch, and each worker sent one batch (1 of 3 here, the rest lost).
    def make():
        return (
            IterableWrapper(range(12)).sharding_filter().filter(not_multiple_of_3).batch(3)
        ).threadpool_map(identity)

    with DataLoader(make(), classic(workers), seed=0) as loader:
        assert list(loader) == [[1, 2, 4], [5, 7, 8], [10, 11]]


def test_a_batch_of_batches_of_one_is_built_from_the_merged_stream():
    # .batch(1) runs in the workers with runs of 1 position; the .batch(3) after it was
    # taken for the batch of an assembled cut, built by each worker of its own items:
    # [[0], [2], [4]], [[1], [3], [5]], [[6]] (and a resume after the epoch's last
    # item gave [[1]] again).
    def make():
        return IterableWrapper(range(7)).sharding_filter().batch(1).batch(3)

    expected = [[[0], [1], [2]], [[3], [4], [5]], [[6]]]
    with DataLoader(make(), classic(2), seed=0) as loader:
        assert list(loader) == expected
    assert "classic" in check_same_output_everywhere(make, workers=2)


def test_a_file_opener_that_skips_gives_the_in_process_batches(files):
    assert "classic" in check_same_output_everywhere(open_files_that_skip(files), workers=3)


@pytest.mark.parametrize("workers", [2, 4])
def test_tar_and_webdataset_give_the_in_process_batches(shards, workers):
    assert "classic" in check_same_output_everywhere(webdataset_pipe(shards), workers=workers)
    assert "classic" in check_same_output_everywhere(members_pipe(shards), workers=workers)


@pytest.mark.parametrize("drop_last", [False, True])
def test_the_short_last_batch_is_kept_or_dropped_as_in_process(drop_last):
    def make():
        return (
            IterableWrapper(range(23))
            .sharding_filter()
            .filter(not_multiple_of_3)
            .batch(4, drop_last=drop_last)
        )

    expected = list(DataLoader(make(), seed=0))
    with DataLoader(make(), classic(3), seed=0) as loader:
        assert list(loader) == expected
    assert len(expected[-1]) == (4 if drop_last else 3)


def plain(value):
    """``value`` with tensors as lists, so batches compare with ``==``."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def resume_everywhere(make, saved_by, resumed_by):
    """For every step: save, resume in a fresh loader; the epoch is unchanged.

    The states are taken at every step of one epoch (pickled at once), which goes on
    to its end: one saving loader, not one per step (half the loaders of the test).
    """
    expected = plain(list(DataLoader(make(), seed=1)))
    with DataLoader(make(), saved_by(), seed=1) as loader:
        iterator = iter(loader)
        states = [pickle.dumps(loader.state_dict())]
        got = []
        for batch in iterator:
            got.append(batch)
            states.append(pickle.dumps(loader.state_dict()))
    assert plain(got) == expected  # the epoch the states were taken in
    for step, state in enumerate(states):
        with DataLoader(make(), resumed_by(), seed=1) as resumed:
            resumed.load_state_dict(pickle.loads(state))
            assert plain(got[:step] + list(resumed)) == expected, step


def test_resume_at_every_step_under_the_same_and_another_worker_count(shards):
    resume_everywhere(webdataset_pipe(shards, batch_size=3), lambda: classic(2), lambda: classic(2))
    resume_everywhere(flatmap_and_filter, lambda: classic(2), lambda: classic(3))
    resume_everywhere(flatmap_and_filter, lambda: classic(3), lambda: classic(1))


def test_a_checkpoint_moves_to_and_from_other_services():
    resume_everywhere(flatmap_and_filter, lambda: classic(2), lambda: None)
    resume_everywhere(
        flatmap_and_filter, lambda: classic(2, strategy="chunked"), lambda: classic(3)
    )


def test_persistent_workers_run_epochs_after_abandoned_ones():
    def epoch(number):
        loader = DataLoader(flatmap_and_filter(), seed=2)
        loader.set_epoch(number)
        return plain(list(loader))

    with DataLoader(flatmap_and_filter(), classic(2, persistent_workers=True), seed=2) as loader:
        assert plain(list(loader)) == epoch(0)
        next(iter(loader))  # epoch 1, abandoned after one batch
        next(iter(loader))  # epoch 2, likewise
        assert plain(list(loader)) == epoch(3)


def kill_at_13(x):
    if x == 13:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


@pytest.mark.timeout(60)
def test_a_killed_worker_raises_promptly():
    pipe = IterableWrapper(range(60)).sharding_filter().flatmap(three_or_none).map(kill_at_13)
    with DataLoader(pipe.batch(4), classic(3), seed=0) as loader:
        with pytest.raises(WorkerError, match="signal|killed|SIGKILL"):
            list(loader)


def fails_on_sample_7(sample):
    if sample["__key__"] == "sample-00007":
        raise ValueError("bad label")
    return sample


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [1, 3])
def test_an_error_names_the_block_and_the_item(workers):
    samples = [{"__key__": f"sample-{i:05d}", "data": bytes(100)} for i in range(30)]

    def two_copies(sample):
        return [sample, dict(sample, __key__=sample["__key__"] + "-copy")]

    pipe = IterableWrapper(samples).sharding_filter().flatmap(two_copies)
    with DataLoader(pipe.map(fails_on_sample_7).batch(4), classic(workers), seed=0) as loader:
        with pytest.raises(ValueError, match="bad label") as info:
            list(loader)
    origin = info.value.__cause__
    assert isinstance(origin, WorkerError)
    assert origin.block is not None and origin.block.startswith("Mapper")
    assert origin.item_repr == "with __key__ 'sample-00007'"


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    recipe=recipes,
    workers=st.integers(1, 3),
    other=st.integers(1, 3),
    stop=st.integers(0, 12),
    seed=st.integers(0, 99),
)
def test_random_pipelines_resume_under_another_worker_count(recipe, workers, other, stop, seed):
    recipe = batched(recipe, one_to_one=False)
    expected = list(DataLoader(build(recipe), seed=seed))
    stop = min(stop, len(expected))
    with DataLoader(build(recipe), classic(workers), seed=seed) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(stop)]
        state = loader.state_dict()
    with DataLoader(build(recipe), classic(other), seed=seed) as resumed:
        resumed.load_state_dict(state)
        assert head + list(resumed) == expected
