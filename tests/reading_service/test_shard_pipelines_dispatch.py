"""Economic and chunked on tar-shard pipelines: refusals whose advice works when followed.

Issue #13 item 9: economic refuses a per-item part that is not one to one and
says which strategies run it; chunked refuses an open file as the sharding
point's item and says to shard paths; following either piece of advice gives
the in-process batches. Chunked spreads shards over its workers by default.
"""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from pipeloom import DataLoader, get_worker_info
from pipeloom.datapipes import FileLister, FileOpener
from pipeloom.reading_service import MultiProcessingReadingService


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    for s in range(2):
        with tarfile.open(os.path.join(root, f"shard-{s}.tar"), "w") as tar:
            for i in range(6):
                for ext in ("txt", "cls"):
                    data = f"{s}-{i}-{ext}".encode()
                    info = tarfile.TarInfo(f"s{s}_{i:03d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return str(root)


def key(sample):
    return sample["__key__"]


def key_and_worker(sample):
    return sample["__key__"], get_worker_info().id


def paths_then_open(root):  # the advice: shard paths, open after the sharding point
    return (
        FileLister(root, "shard-*.tar")
        .sharding_filter()
        .open_files("rb")
        .load_from_tar()
        .webdataset()
        .map(key)
        .batch(4)
    )


def run(pipeline, strategy):
    service = MultiProcessingReadingService(2, strategy=strategy)
    with DataLoader(pipeline, service, seed=0) as loader:
        return list(loader)


@pytest.mark.timeout(90)
def test_economic_names_the_strategies_that_run_a_tar_pipeline_and_they_do(shards):
    with pytest.raises(ValueError, match=r"Use strategy='chunked' or 'classic'") as info:
        run(paths_then_open(shards), "economic")
    assert "WebDataset()" in str(info.value)
    expected = list(DataLoader(paths_then_open(shards), seed=0))
    assert sum(len(batch) for batch in expected) == 12
    for strategy in ("chunked", "classic"):  # what the message says to use
        assert run(paths_then_open(shards), strategy) == expected, strategy


@pytest.mark.timeout(90)
def test_chunked_refuses_open_files_as_the_sharding_points_items_and_its_advice_works(shards):
    opener_shards = (
        FileOpener(FileLister(shards, "shard-*.tar"), mode="rb")
        .load_from_tar()
        .webdataset()
        .map(key)
        .batch(4)
    )
    with pytest.raises(TypeError, match=r"Shard something picklable \(file paths, indices\)"):
        run(opener_shards, "chunked")
    expected = list(DataLoader(paths_then_open(shards), seed=0))
    assert run(paths_then_open(shards), "chunked") == expected


@pytest.mark.timeout(90)
def test_chunked_spreads_the_shards_of_an_expanding_pipeline_over_its_workers(shards):
    pipeline = (
        FileLister(shards, "shard-*.tar")
        .sharding_filter()
        .open_files("rb")
        .load_from_tar()
        .webdataset()
        .map(key_and_worker)
        .batch(4)
    )
    service = MultiProcessingReadingService(2, strategy="chunked")
    with DataLoader(pipeline, service, seed=0) as loader:
        out = [pair for batch in loader for pair in batch]
        assert loader.placement().unit[1] == 1  # one shard per chunk
    assert len(out) == 12
    assert {worker for _, worker in out} == {0, 1}


def read_text(path_and_stream):
    path, stream = path_and_stream
    with stream:
        return os.path.basename(path), stream.read().decode(), get_worker_info() is not None


@pytest.mark.timeout(90)
@pytest.mark.parametrize("workers", [1, 3])
def test_economic_runs_files_opened_after_the_sharding_point(tmp_path, workers):
    """``open_files`` below ``sharding_filter`` keeps every path (one stream per input),
    so economic's item workers open and read them: the JPEG-folder pipeline's shape."""
    for i in range(11):
        (tmp_path / f"f{i:02d}.txt").write_text(f"text {i}")

    def pipeline():
        return (
            FileLister(str(tmp_path), "*.txt")
            .shuffle()
            .sharding_filter()
            .open_files("rb")
            .map(read_text)
            .batch(3)
        )

    expected = [[item[:2] for item in batch] for batch in DataLoader(pipeline(), seed=4)]
    service = MultiProcessingReadingService(workers, strategy="economic")
    with DataLoader(pipeline(), service, seed=4) as loader:
        placement = str(loader.placement())
        got = list(loader)
    assert [[item[:2] for item in batch] for batch in got] == expected
    assert all(item[2] for batch in got for item in batch)  # read in the item workers
    assert "item worker processes" in placement
