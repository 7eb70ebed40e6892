"""Attacks on chunked's relayed batches (``strategies/dispatch/relay.py``).

Each test drives relayed chunks the way a user would and checks the in-process
result, the errors, resume and the cleanup: what a tester outside the project
tried to break, kept where it found a bug or guards a property.
"""

from __future__ import annotations

import functools
import io
import os
import tarfile

import pytest
import torch

from pipeloom import DataLoader, item_rng
from pipeloom.datapipes import FileLister, IterableWrapper
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from pipeloom.reading_service.strategies.dispatch import pool
from tests.reading_service.test_strategies import plain


def expand(sizes, index):
    """Input ``index`` makes ``sizes[index]`` outputs."""
    return [(index, j) for j in range(sizes[index])]


def fails_while(flag, bad, pair):
    """Raise at output ``bad`` while the file ``flag`` exists."""
    if pair == bad and os.path.exists(flag):
        raise ValueError(f"sample {pair} is bad")
    return pair


def failing_once(flag, sizes, batch):
    pipe = IterableWrapper(range(len(sizes))).sharding_filter()
    pipe = pipe.flatmap(functools.partial(expand, sizes))
    return pipe.map(functools.partial(fails_while, flag, (1, 0))).batch(batch)


@pytest.mark.timeout(40)
@pytest.mark.parametrize("workers", [1, 3])
def test_an_epoch_after_a_failed_one_runs_on_persistent_workers(tmp_path, workers):
    """After a chunk fails, every later chunk of the epoch relays a stop. A worker
    that skipped its chunk left its predecessor's stop in the link: with many chunks
    in flight the link (4 relays) filled, the worker blocked on it for good, and the
    next epoch's tasks never ran (1 worker, chunks of 1: the second epoch hung)."""
    flag = str(tmp_path / "bad")
    open(flag, "w").close()  # noqa: SIM115 - an empty file
    sizes = [2] * 40
    expected = plain(list(DataLoader(failing_once(str(tmp_path / "none"), sizes, 4), None)))
    service = MultiProcessingReadingService(
        workers, strategy="chunked", chunk_size=1, persistent_workers=True, timeout=10
    )
    with DataLoader(failing_once(flag, sizes, 4), service, seed=0) as loader:
        with pytest.raises(ValueError, match=r"sample \(1, 0\) is bad"):
            list(loader)
        os.remove(flag)
        assert plain(list(loader)) == expected


def gated(fifo, sizes, index):
    """Input ``index``'s outputs; input 1 waits before its first until the test says go."""
    for j in range(sizes[index]):
        if index == 1 and j == 0:
            with open(fifo, "rb") as gate:  # blocks until the test opens it to write
                gate.read(1)
        yield (index, j)


@pytest.mark.timeout(40)
@pytest.mark.parametrize("workers", [1, 2])
def test_a_chunk_that_ends_after_the_loader_shut_down_exits_quietly(
    tmp_path, monkeypatch, capfd, workers
):
    """A worker that finishes its chunk once the main process closed the queues
    stops as the other tasks' workers do, without a traceback (it raised
    ``QueueClosed`` from the put of the chunk's batches)."""
    fifo = str(tmp_path / "gate")
    os.mkfifo(fifo)
    stop = pool.stop_processes

    def release_then_stop(workers, *args):  # the queues are closed by now
        try:  # no reader: the worker never got to the gate (it stopped before)
            gate = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            pass
        else:
            os.write(gate, b"x")
            os.close(gate)
        for worker in workers:  # the gated worker finishes its chunk, then exits
            worker.process.join(timeout=10)
        stop(workers, *args)

    monkeypatch.setattr(pool, "stop_processes", release_then_stop)
    pipe = IterableWrapper(range(2)).sharding_filter()
    pipe = pipe.flatmap(functools.partial(gated, fifo, [2, 3])).batch(2)
    service = MultiProcessingReadingService(workers, strategy="chunked", chunk_size=1, timeout=20)
    with DataLoader(pipe, service, seed=0) as loader:
        assert next(iter(loader)) == [(0, 0), (0, 1)]
    err = capfd.readouterr().err
    assert "Traceback" not in err, err


def write_shards(root, counts):
    """``shard-<s>.tar`` with ``counts[s]`` samples of an ``x`` and a ``cls`` member."""
    for s, count in enumerate(counts):
        with tarfile.open(os.path.join(root, f"shard-{s}.tar"), "w") as tar:
            for i in range(count):
                for ext, data in (("x", bytes([s, i]) * 3), ("cls", str(s * 100 + i).encode())):
                    info = tarfile.TarInfo(f"s{s}_{i:03d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def decode(sample):
    return torch.tensor(list(sample["x"])) + int(item_rng().integers(100)), int(sample["cls"])


def tar_pipeline(root, batch):
    return (
        FileLister(root, "shard-*.tar")
        .sharding_filter()
        .open_files("rb")
        .load_from_tar()
        .webdataset()
        .map(decode)
        .batch(batch)
        .collate()
    )


def delivered_until_error(pipe, service):
    """The batches delivered, then the error the loader raised (None if it did not)."""
    got = []
    try:
        with DataLoader(pipe, service, seed=1) as loader:
            for batch in loader:
                got.append(plain(batch))
    except Exception as error:  # noqa: BLE001 - compared with the in-process one
        return got, error
    return got, None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage", ["garbage", "truncated header"])
def test_an_unreadable_shard_raises_after_the_whole_samples_before_it_everywhere(tmp_path, damage):
    """The last sample of the shard before an unreadable one is whole: in-process it
    was dropped (``webdataset`` waited for the next member to close it, and the next
    read raised) while chunked's worker, whose task ends at its shard, delivered it:
    one batch more under chunked than in-process (shards [9, 3], batch 3)."""
    write_shards(str(tmp_path), [9, 3, 2])
    path = tmp_path / "shard-1.tar"
    data = bytearray(path.read_bytes())
    data = bytearray(b"garbage" * 100) if damage == "garbage" else data[:100]
    path.write_bytes(bytes(data))
    expected, error = delivered_until_error(tar_pipeline(str(tmp_path), 3), None)
    assert [batch[1] for batch in expected] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert type(error).__name__ == "ReadError" and "shard-1.tar" in str(error)
    for service in (
        MultiProcessingReadingService(1, strategy="chunked", chunk_size=2, timeout=20),
        MultiProcessingReadingService(3, strategy="chunked", timeout=20),
        ThreadReadingService(2),
    ):
        got, got_error = delivered_until_error(tar_pipeline(str(tmp_path), 3), service)
        assert got == expected
        assert type(got_error) is type(error) and str(got_error).startswith(str(error))
