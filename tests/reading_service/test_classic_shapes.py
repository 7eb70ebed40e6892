"""A checkpoint moves between threads and whole-batch worker processes without a replay.

Threads leave ``batch``/``collate`` to the main process; worker processes
build whole batches for pipelines whose per-item part drops or multiplies
items (``strategies/classic/assemble.py``). Between two batches both resume
from the same point, so ``strategies/classic/translate.py`` carries a
checkpoint across exactly: the resumed loader decodes only what is left (plus
the delivered outputs of the one position it restarts in), where a replay
would decode the whole epoch again. Autotune relies on it when it moves a
tar pipeline from threads to processes.
"""

from __future__ import annotations

import io
import pickle
import tarfile

import pytest

from pipeloom import DataLoader, item_rng
from pipeloom.datapipes import FileLister
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService

pytestmark = pytest.mark.timeout(120)

SHARD_SIZES = (3, 5, 7, 9, 11)


@pytest.fixture
def shards(tmp_path):
    root = tmp_path / "shards"
    root.mkdir()
    number = 0
    for shard, size in enumerate(SHARD_SIZES):
        with tarfile.open(root / f"shard-{shard}.tar", "w") as tar:
            for _ in range(size):
                for ext, data in (("num", str(number).encode()), ("txt", b"x" * number)):
                    info = tarfile.TarInfo(f"s{number:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                number += 1
    return root


class Decode:
    """Decode a sample and log the call (a file: worker processes write it too)."""

    def __init__(self, log):
        self.log = str(log)

    def __call__(self, sample):
        with open(self.log, "a") as f:
            f.write("x\n")
        return int(sample["num"]), len(sample["txt"]), int(item_rng().integers(1000))


def pipeline(root, log):
    return (
        FileLister(str(root), "*.tar")
        .shuffle()
        .sharding_filter()
        .open_files("rb")
        .load_from_tar()
        .webdataset()
        .map(Decode(log))
        .batch(4)
    )


SERVICES = {
    "threads": lambda: ThreadReadingService(2),
    "processes": lambda: MultiProcessingReadingService(2, timeout=60),
}


@pytest.mark.parametrize(
    ("saved_by", "resumed_by"), [("threads", "processes"), ("processes", "threads")]
)
@pytest.mark.parametrize("step", [1, 4, 7])
def test_the_rest_of_the_epoch_is_read_without_replaying_it(
    shards, tmp_path, saved_by, resumed_by, step
):
    log = tmp_path / "decoded.txt"
    expected = list(DataLoader(pipeline(shards, log), seed=2))
    with DataLoader(pipeline(shards, log), SERVICES[saved_by](), seed=2) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(step)]
        state = pickle.loads(pickle.dumps(loader.state_dict()))
    log.unlink()
    with DataLoader(pipeline(shards, log), SERVICES[resumed_by](), seed=2) as resumed:
        resumed.load_state_dict(state)
        rest = list(resumed)
    assert head + rest == expected
    left = sum(len(batch) for batch in rest)
    decoded = len(log.read_text().splitlines())
    # the position the resume restarts in is decoded again up to its delivered outputs
    assert left <= decoded <= left + max(SHARD_SIZES), (decoded, left)


def test_a_checkpoint_taken_mid_batch_on_the_main_side_is_replayed(shards, tmp_path):
    """A main-process batch holding items cannot become a worker's: the loader replays."""
    log = tmp_path / "decoded.txt"
    make = lambda: pipeline(shards, log).unbatch().batch(3)  # noqa: E731
    expected = list(DataLoader(make(), seed=2))
    with DataLoader(make(), SERVICES["threads"](), seed=2) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(2)]
        state = loader.state_dict()
    with DataLoader(make(), SERVICES["processes"](), seed=2) as resumed:
        resumed.load_state_dict(state)
        assert head + list(resumed) == expected
