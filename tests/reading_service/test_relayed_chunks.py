"""Chunked builds whole batches in its item workers when the per-item part is not one to one.

A tar reader, ``webdataset()``, ``flatmap`` or ``filter`` before ``batch``: each
chunk's worker builds the batches its chunk completes, relaying the items
that do not fill one to the next chunk's worker (``strategies/dispatch/relay.py``).
The batches, their ``item_rng()`` draws, the errors and the resume points are
the in-process ones, for any worker count.
"""

from __future__ import annotations

import functools
import io
import itertools
import os
import tarfile

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader, item_rng
from pipeloom.datapipes import FileLister, IterableWrapper
from pipeloom.reading_service import MultiProcessingReadingService
from tests.reading_service.resuming import resume_case
from tests.reading_service.test_strategies import plain, until_error


def expand(sizes, index):
    """Input ``index`` makes ``sizes[index]`` outputs (a tar shard of that many samples)."""
    return [(index, j) for j in range(sizes[index])]


def draw(pair):
    return (*pair, int(item_rng().integers(1000)))


def fails_at(at, pair):
    if pair[0] * 10 + pair[1] == at:
        raise ValueError(f"sample {pair} is bad")
    return pair


def expanding(sizes, batch, drop_last=False, keep=None):
    pipe = IterableWrapper(range(len(sizes))).shuffle().sharding_filter()
    pipe = pipe.flatmap(functools.partial(expand, sizes))
    if keep is not None:
        pipe = pipe.filter(keep)
    return pipe.map(draw).batch(batch, drop_last=drop_last).collate()


def odd_second(pair):
    return pair[1] % 2 == 1


def chunked(workers, chunk=None):
    extra = {} if chunk is None else {"chunk_size": chunk}
    return MultiProcessingReadingService(workers, strategy="chunked", timeout=30, **extra)


def run(pipe, service, seed=5, epochs=2):
    with DataLoader(pipe, service, seed=seed) as loader:
        return [plain(list(loader)) for _ in range(epochs)]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("relayed")
    for s, count in enumerate([5, 0, 3, 7, 1]):
        with tarfile.open(os.path.join(root, f"shard-{s}.tar"), "w") as tar:
            for i in range(count):
                for ext, data in (("x", bytes([s, i]) * 3), ("cls", str(s * 10 + i).encode())):
                    info = tarfile.TarInfo(f"s{s}_{i:03d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return str(root)


def decode(sample):
    return torch.tensor(list(sample["x"])) + int(item_rng().integers(100)), int(sample["cls"])


def tar_pipeline(root, batch=4, shuffle=True):
    shards = FileLister(root, "shard-*.tar")
    return (
        (shards.shuffle() if shuffle else shards)
        .sharding_filter()
        .open_files("rb")
        .load_from_tar()
        .webdataset()
        .map(decode)
        .batch(batch)
        .collate()
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, 3])
def test_chunked_builds_and_collates_a_tar_pipelines_batches_in_its_item_workers(shards, workers):
    pipe = tar_pipeline(shards)
    with DataLoader(pipe, chunked(workers), seed=2) as loader:
        plan = loader.placement()
        got = [plain(list(loader)) for _ in range(2)]
    assert plan.where(pipe) == plan.where(pipe.source) == f"item worker processes x{workers}"
    assert "relayed items that do not fill a batch" in str(plan)
    assert got == run(tar_pipeline(shards), None, seed=2)
    assert sum(len(batch[1]) for batch in got[0]) == 16


@settings(max_examples=12, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 6), max_size=8),
    batch=st.integers(1, 5),
    drop_last=st.booleans(),
    workers=st.integers(1, 3),
    chunk=st.one_of(st.none(), st.integers(1, 5)),
    filtered=st.booleans(),
)
def test_relayed_chunks_give_the_in_process_batches(
    sizes, batch, drop_last, workers, chunk, filtered
):
    keep = odd_second if filtered else None
    expected = run(expanding(sizes, batch, drop_last, keep), None)
    service = chunked(workers, None if chunk is None else min(chunk, batch))
    assert run(expanding(sizes, batch, drop_last, keep), service) == expected


@settings(max_examples=10, deadline=None)
@given(
    at=st.integers(0, 45),
    batch=st.integers(1, 4),
    workers=st.integers(1, 3),
)
def test_relayed_chunks_raise_an_error_after_every_batch_made_before_it(at, batch, workers):
    sizes = [3, 5, 0, 4, 2]

    def pipeline():
        pipe = IterableWrapper(range(len(sizes))).sharding_filter()
        pipe = pipe.flatmap(functools.partial(expand, sizes))
        return pipe.map(functools.partial(fails_at, at)).batch(batch)

    expected, error, _ = until_error(pipeline(), None) if _raises(at, sizes) else (None,) * 3
    if expected is None:  # no sample is bad: every batch arrives
        assert run(pipeline(), chunked(workers), epochs=1) == run(pipeline(), None, epochs=1)
        return
    delivered, got, _ = until_error(pipeline(), chunked(workers))
    assert delivered == expected
    assert type(got) is type(error) and str(got).startswith(str(error))
    assert "item worker" in str(got)


def _raises(at, sizes):
    return any(i * 10 + j == at for i, n in enumerate(sizes) for j in range(n))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stop", [0, 1, 4, 7])
def test_relayed_chunks_resume_mid_epoch_under_another_worker_count(stop):
    sizes = [3, 6, 0, 1, 5, 2, 4]
    counts = itertools.cycle([2, 2, 3])  # the resumed loader has 3 workers

    def service():
        return chunked(next(counts))

    resume_case(lambda: expanding(sizes, 4, keep=odd_second), service, stop, compare=plain)
    resume_case(lambda: expanding(sizes, 3), service, stop, compare=plain)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("abandon_after", [0, 1, 3])
def test_persistent_workers_drop_an_abandoned_epochs_relays(abandon_after):
    sizes = [4, 0, 6, 3, 5, 1, 2, 7]
    expected = run(expanding(sizes, 3, keep=odd_second), None, epochs=3)
    service = MultiProcessingReadingService(
        3, persistent_workers=True, strategy="chunked", timeout=30
    )
    with DataLoader(expanding(sizes, 3, keep=odd_second), service, seed=5) as loader:
        got = []
        for epoch in range(3):
            iterator = iter(loader)
            for _ in range(abandon_after):  # abandon with chunks and relays in flight
                next(iterator)
            loader.set_epoch(epoch)
            got.append(plain(list(loader)))
    assert got == expected


@pytest.mark.timeout(120)
def test_relayed_chunks_under_spawn_and_a_shutdown_mid_epoch():
    sizes = [5, 2, 6, 0, 3]
    service = MultiProcessingReadingService(2, strategy="chunked", start_method="spawn", timeout=60)
    with DataLoader(expanding(sizes, 2), service, seed=5) as loader:
        assert plain(list(loader)) == run(expanding(sizes, 2), None, epochs=1)[0]
        iterator = iter(loader)
        next(iterator)  # the loader shuts down with workers waiting for relays


def gated(fifo, sizes, index, at=(0, 3)):
    """Input ``index``'s outputs; output ``at = (input, j)`` waits until the test says go
    (until it opens the fifo to write)."""
    for j in range(sizes[index]):
        if (index, j) == at:
            with open(fifo, "rb") as gate:  # blocks until the test opens it to write
                gate.read(1)
        yield (index, j)


@pytest.mark.timeout(60)
def test_the_epochs_first_chunk_sends_each_batch_as_soon_as_it_is_full(tmp_path):
    fifo = str(tmp_path / "gate")
    os.mkfifo(fifo)
    sizes = [7, 2]
    pipe = IterableWrapper(range(2)).sharding_filter()
    pipe = pipe.flatmap(functools.partial(gated, fifo, sizes)).batch(3)
    service = MultiProcessingReadingService(2, strategy="chunked", timeout=20)
    with DataLoader(pipe, service, seed=0) as loader:
        iterator = iter(loader)
        first = next(iterator)  # while its chunk's worker waits at the 4th output
        with open(fifo, "wb") as gate:
            gate.write(b"x")
        rest = list(iterator)
    assert [first, *rest] == [
        [(0, 0), (0, 1), (0, 2)],
        [(0, 3), (0, 4), (0, 5)],
        [(0, 6), (1, 0), (1, 1)],
    ]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_large_chunks_keep_the_prefetch_bound_not_the_chunk_count(workers):
    """A chunk of one input that makes many outputs (a big tar shard) is many batches:
    once measured, only the chunks every worker needs run ahead, not ``prefetch *
    batch_size`` of them (which held nearly the whole epoch's decoded samples ahead of
    a slow consumer), and the output is still the in-process one."""
    sizes = [40] * 24  # 2.5 batches of 16 per input; planned: 2 * 16 chunks in flight
    pipe = expanding(sizes, 16)
    service = MultiProcessingReadingService(workers, strategy="chunked", timeout=30)
    in_flight = []
    with DataLoader(pipe, service, seed=3) as loader:
        batches = []
        for batch in loader:
            batches.append(batch)
            dispatcher = service._runner.dispatcher  # noqa: SLF001
            in_flight.append(len(dispatcher.in_flight))
    assert dispatcher.max_units == 32
    assert max(in_flight[2:]) <= workers + 1, in_flight
    assert plain(batches) == run(expanding(sizes, 16), None, seed=3, epochs=1)[0]
