"""Attacks on chunked's relayed batches (``strategies/dispatch/relay.py``).

Each test drives relayed chunks the way a user would and checks the in-process
result, the errors, resume and the cleanup: what a tester outside the project
tried to break, kept where it found a bug or guards a property.
"""

from __future__ import annotations

import functools
import os

import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import MultiProcessingReadingService
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
    open(flag, "w").close()
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
