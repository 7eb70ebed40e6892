"""Attacks on chunked's relayed batches (``strategies/dispatch/relay.py``).

Each test drives relayed chunks the way a user would and checks the in-process
result, the errors, resume and the cleanup: what a tester outside the project
tried to break, kept where it found a bug or guards a property.
"""

from __future__ import annotations

import functools
import gc
import io
import multiprocessing.connection
import os
import pickle
import signal
import tarfile
import threading

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader, item_rng
from pipeloom.datapipes import FileLister, IterableWrapper
from pipeloom.errors import WorkerError
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from pipeloom.reading_service.strategies.dispatch import item_worker, pool
from tests.own_resources import OwnResources
from tests.reading_service.test_relayed_chunks import decode, gated, tar_pipeline
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
    gate = []

    def release_then_stop(workers, *args):  # the queues are closed by now
        os.write(gate[0], b"x")
        os.close(gate[0])
        # the gated worker finishes its chunk, then exits; the others exit on Stop
        left = {w.process.sentinel for w in workers}
        while left and (ready := multiprocessing.connection.wait(list(left), timeout=10)):
            left -= set(ready)
        stop(workers, *args)

    monkeypatch.setattr(pool, "stop_processes", release_then_stop)
    pipe = IterableWrapper(range(2)).sharding_filter()
    pipe = pipe.flatmap(functools.partial(gated, fifo, [2, 3], at=(1, 0))).batch(2)
    service = MultiProcessingReadingService(workers, strategy="chunked", chunk_size=1, timeout=20)
    with DataLoader(pipe, service, seed=0) as loader:
        assert next(iter(loader)) == [(0, 0), (0, 1)]
        # returns once a worker waits at the gate (released above, after the queues closed;
        # released at once, a busy worker got there too late and was killed, unchecked)
        gate.append(os.open(fifo, os.O_WRONLY))
    err = capfd.readouterr().err
    assert "Traceback" not in err, err


@pytest.mark.timeout(40)
def test_a_worker_that_starts_after_its_sibling_stopped_exits_quietly(tmp_path, monkeypatch, capfd):
    """Its epoch's start reads the relay links (to drop stale relays); when the loader
    closed after one batch before item worker 1 got there (a busy machine), item worker 0
    had exited already and worker 1 died with a ``QueueBroken`` traceback on stderr."""
    fifo = str(tmp_path / "gate")
    os.mkfifo(fifo)
    start, stop = item_worker.bootstrap, pool.stop_processes
    codes = []

    def bootstrap(name, **kwargs):  # in the forked workers: item worker 1 waits for go
        if name == "item worker 1":
            with open(fifo, "rb") as gate:
                gate.read(1)
        return start(name, **kwargs)

    def start_late_then_stop(workers, *args):  # the queues are closed by now
        first, late = (w.process for w in workers)
        first.join(timeout=10)  # it exits on Stop
        codes.append(first.exitcode)
        with open(fifo, "wb") as gate:
            gate.write(b"x")
        late.join(timeout=10)
        codes.append(late.exitcode)
        stop(workers, *args)

    monkeypatch.setattr(item_worker, "bootstrap", bootstrap)
    monkeypatch.setattr(pool, "stop_processes", start_late_then_stop)
    pipe = IterableWrapper(range(2)).sharding_filter().flatmap(functools.partial(expand, [2, 3]))
    service = MultiProcessingReadingService(2, strategy="chunked", chunk_size=1, timeout=20)
    with DataLoader(pipe.batch(2), service, seed=0) as loader:
        assert next(iter(loader)) == [(0, 0), (0, 1)]
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    assert codes == [0, 0]  # both exited on their own


def write_shards(root, counts):
    """``shard-<s>.tar`` with ``counts[s]`` samples of an ``x`` and a ``cls`` member."""
    for s, count in enumerate(counts):
        with tarfile.open(os.path.join(root, f"shard-{s}.tar"), "w") as tar:
            for i in range(count):
                for ext, data in (("x", bytes([s, i]) * 3), ("cls", str(s * 100 + i).encode())):
                    info = tarfile.TarInfo(f"s{s}_{i:03d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


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
    expected, error = delivered_until_error(tar_pipeline(str(tmp_path), 3, shuffle=False), None)
    assert [batch[1] for batch in expected] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert type(error).__name__ == "ReadError" and "shard-1.tar" in str(error)
    for service in (
        MultiProcessingReadingService(1, strategy="chunked", chunk_size=2, timeout=20),
        MultiProcessingReadingService(3, strategy="chunked", timeout=20),
        ThreadReadingService(2),
    ):
        got, got_error = delivered_until_error(
            tar_pipeline(str(tmp_path), 3, shuffle=False), service
        )
        assert got == expected
        assert type(got_error) is type(error) and str(got_error).startswith(str(error))


def draw(pair):
    return (*pair, int(item_rng().integers(1000)))


def drop_shards(bad, pair):
    return pair[0] not in bad


def fanned_out(sizes, batch, drop_last=False, bad=None, unbatch=None):
    """Inputs fanned out by ``sizes`` (runs of empty inputs, inputs larger than a batch),
    optionally whole inputs filtered out, an ``item_rng()`` draw per output."""
    pipe = IterableWrapper(range(len(sizes))).shuffle().sharding_filter()
    pipe = pipe.flatmap(functools.partial(expand, sizes))
    if bad:
        pipe = pipe.filter(functools.partial(drop_shards, frozenset(bad)))
    pipe = pipe.map(draw)
    if unbatch:
        pipe = pipe.batch(unbatch).unbatch()
    return pipe.batch(batch, drop_last=drop_last).collate()


def epochs_of(pipe, service, seed=5, epochs=2):
    with DataLoader(pipe, service, seed=seed) as loader:
        return [plain(list(loader)) for _ in range(epochs)]


SIZES = st.lists(st.sampled_from([0, 0, 0, 1, 2, 3, 7, 15]), max_size=12)


def a_service(kind, workers, chunk):
    if kind == "threads":
        return ThreadReadingService(workers)
    if kind == "classic":
        return MultiProcessingReadingService(workers, strategy="classic", timeout=30)
    extra = {} if chunk is None else {"chunk_size": chunk}
    return MultiProcessingReadingService(workers, strategy="chunked", timeout=30, **extra)


@settings(max_examples=10, deadline=None)
@given(
    sizes=SIZES,
    batch=st.sampled_from([1, 2, 3, 7, 16, 40]),
    drop_last=st.booleans(),
    bad=st.sets(st.integers(0, 11), max_size=3),
    workers=st.integers(1, 4),
    chunk=st.one_of(st.none(), st.integers(1, 5)),
    kind=st.sampled_from(["chunked", "chunked", "classic", "threads"]),
)
def test_every_service_gives_the_in_process_batches_and_draws_of_a_fan_out(
    sizes, batch, drop_last, bad, workers, chunk, kind
):
    expected = epochs_of(fanned_out(sizes, batch, drop_last, bad), None)
    service = a_service(kind, workers, None if chunk is None else min(chunk, batch))
    assert epochs_of(fanned_out(sizes, batch, drop_last, bad), service) == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize("inner", [1, 3])
def test_relayed_chunks_after_an_unbatch_give_the_in_process_batches(inner):
    sizes = [0, 0, 0, 15, 1, 0, 7, 2, 0, 0, 3]
    expected = epochs_of(fanned_out(sizes, 4, unbatch=inner), None)
    for workers in (1, 3):
        service = MultiProcessingReadingService(workers, strategy="chunked", timeout=30)
        assert epochs_of(fanned_out(sizes, 4, unbatch=inner), service) == expected


@settings(max_examples=8, deadline=None)
@given(
    sizes=SIZES.filter(lambda s: sum(s) > 0),
    batch=st.sampled_from([1, 2, 3, 5, 16]),
    bad=st.sets(st.integers(0, 11), max_size=3),
    stop=st.floats(0, 1),
    first=st.tuples(st.sampled_from(["chunked", "classic", "threads"]), st.integers(1, 4)),
    then=st.tuples(st.sampled_from(["chunked", "classic", "threads"]), st.integers(1, 4)),
    chunk=st.one_of(st.none(), st.integers(1, 3)),
)
def test_a_relayed_epoch_stopped_anywhere_resumes_under_another_service(
    sizes, batch, bad, stop, first, then, chunk
):
    """The batches before ``state_dict()`` and after ``load_state_dict`` into a loader
    with another strategy and worker count are one in-process epoch: none twice, no gap."""

    def build():
        return fanned_out(sizes, batch, bad=bad)

    chunk = None if chunk is None else min(chunk, batch)
    with DataLoader(build(), None, seed=3) as loader:
        list(loader)
        expected, following = plain(list(loader)), plain(list(loader))
    k = round(stop * len(expected))
    with DataLoader(build(), a_service(*first, chunk), seed=3) as loader:
        list(loader)
        iterator = iter(loader)
        head = plain([next(iterator) for _ in range(k)])
        state = pickle.loads(pickle.dumps(loader.state_dict()))
    with DataLoader(build(), a_service(*then, chunk), seed=4) as resumed:
        resumed.load_state_dict(state)
        assert head + plain(list(resumed)) == expected
        assert plain(list(resumed)) == following


@pytest.mark.timeout(60)
def test_states_taken_from_another_thread_resume_exactly_after_the_batches_before_them():
    sizes = [3, 0, 0, 0, 11, 1, 0, 5, 2, 7, 0, 4] * 2
    with DataLoader(fanned_out(sizes, 4), None, seed=3) as loader:
        expected = plain(list(loader))
    service = MultiProcessingReadingService(2, strategy="chunked", chunk_size=1, timeout=20)
    states, done = [], threading.Event()
    with DataLoader(fanned_out(sizes, 4), service, seed=3) as loader:

        def snapshot():
            while not done.is_set() and len(states) < 200:
                states.append(loader.state_dict())

        thread = threading.Thread(target=snapshot)
        thread.start()
        try:
            got = [plain(batch) for batch in loader]
        finally:
            done.set()
            thread.join(timeout=20)
    assert got == expected
    for state in states[:: max(1, len(states) // 12)]:
        if state["epoch"] != 0:  # taken after the last batch: the next epoch's start
            continue
        with DataLoader(fanned_out(sizes, 4), None, seed=3) as resumed:
            resumed.load_state_dict(state)
            assert expected[state["delivered"] :] == plain(list(resumed))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [1, 3])
def test_a_killed_worker_is_named_and_its_processes_are_gone(workers):
    sizes = [4] * 500
    pipe = fanned_out(sizes, 3)
    service = MultiProcessingReadingService(workers, strategy="chunked", chunk_size=1, timeout=20)
    before = OwnResources()  # its children, threads and fds (memfds: its shared memory)
    with pytest.raises(WorkerError) as info:
        with DataLoader(pipe, service, seed=0) as loader:
            for index, _ in enumerate(loader):
                if index == 2:  # workers mid-chunk and waiting for relays
                    # one of this loader's item workers (the session's fork server and
                    # resource tracker, maybe started meanwhile, are children too)
                    workers_now = service._runner._pool._workers  # noqa: SLF001
                    victim = workers_now[-1].pid
                    os.kill(victim, signal.SIGKILL)
    assert f"pid {victim}" in str(info.value) and "item worker" in str(info.value)
    before.assert_released()


@pytest.mark.timeout(60)
def test_a_dropped_loader_stops_its_workers_without_the_garbage_collector():
    pipe = fanned_out([3, 0, 0, 11, 1, 5] * 20, 4)
    before = OwnResources()  # the session's fork server may be a child already
    gc.disable()
    try:
        loader = DataLoader(pipe, MultiProcessingReadingService(2, strategy="chunked"), seed=0)
        iterator = iter(loader)
        next(iterator)  # workers waiting for relays and for room in the queues
        del loader, iterator
        assert before.left_after(timeout=10).children == []
    finally:
        gc.enable()


def opens(sizes, at, index):
    """Input ``index``'s outputs; input ``at`` cannot be opened."""
    if index == at:
        raise OSError(f"cannot open input {index}")
    return [(index, j) for j in range(sizes[index])]


@settings(max_examples=10, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([0, 1, 2, 3, 7]), min_size=1, max_size=10),
    at=st.integers(0, 9),
    batch=st.sampled_from([1, 2, 3, 5]),
    workers=st.integers(1, 3),
    kind=st.sampled_from(["chunked", "classic", "threads"]),
)
@example(sizes=[3] * 6, at=3, batch=2, workers=1, kind="classic")
def test_every_service_delivers_the_batches_made_before_an_input_that_fails(
    sizes, at, batch, workers, kind
):
    """In-process, the batches the outputs before the failing input fill come first.
    Classic's worker dropped every batch of its run made before the error (1 worker,
    sizes [3] * 6, input 3 failing, batch 2: [20, 21] was missing)."""

    def build():
        pipe = IterableWrapper(range(len(sizes))).sharding_filter()
        pipe = pipe.flatmap(functools.partial(opens, sizes, at)).map(draw)
        return pipe.batch(batch).collate()

    expected, error = delivered_until_error(build(), None)
    got, got_error = delivered_until_error(build(), a_service(kind, workers, None))
    assert got == expected
    assert type(got_error) is type(error)
    if error is not None:
        assert str(got_error).startswith(str(error))


@pytest.mark.timeout(30)
def test_abandoned_epochs_whose_first_chunk_outgrows_the_queue_do_not_block_the_next():
    """An abandoned epoch's first chunk streams more batches than the queue to the main
    process holds: its worker waits for room and takes no task. The main process, sending
    the next epochs' tasks into the worker's full task queue, read nothing meanwhile:
    both waited, 60 s, then "a worker stopped taking work" (1 worker, batch 4, chunk 1)."""
    sizes = [60] * 11
    expected = epochs_of(fanned_out(sizes, 4), None, seed=7, epochs=1)[0]
    service = MultiProcessingReadingService(
        1, strategy="chunked", chunk_size=1, persistent_workers=True, timeout=20
    )
    with DataLoader(fanned_out(sizes, 4), service, seed=7) as loader:
        next(iter(loader))  # abandoned with its first chunk half sent
        loader.set_epoch(0)
        assert plain(list(loader)) == expected


def decode_failing_at(bad, sample):
    if int(sample["cls"]) == bad:
        raise ValueError(f"cannot decode sample {bad}")
    return decode(sample)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", [0, 4, 202, 207])
def test_a_sample_that_fails_to_decode_raises_after_the_batches_before_it(tmp_path, bad):
    write_shards(str(tmp_path), [5, 0, 8, 1])

    def build():
        pipe = FileLister(str(tmp_path), "shard-*.tar").sharding_filter().open_files("rb")
        pipe = pipe.load_from_tar().webdataset().map(functools.partial(decode_failing_at, bad))
        return pipe.batch(3).collate()

    expected, error = delivered_until_error(build(), None)
    assert isinstance(error, ValueError)
    for workers in (1, 3):
        service = MultiProcessingReadingService(workers, strategy="chunked", timeout=20)
        got, got_error = delivered_until_error(build(), service)
        assert got == expected
        assert type(got_error) is ValueError and str(got_error).startswith(str(error))
        assert "item worker" in str(got_error) and "Mapper" in str(got_error)


def resumed_twice(first, between, then, k, iterate):
    """``k`` batches under ``first``; its state loaded under ``between``, saved again
    before any batch (after ``iter()`` if ``iterate``); the rest under ``then``."""
    sizes = [2, 0, 15, 7, 1, 2, 7, 0, 2, 7]
    with DataLoader(fanned_out(sizes, 3), None, seed=4) as loader:
        expected = plain(list(loader))
    with DataLoader(fanned_out(sizes, 3), first(), seed=4) as loader:
        iterator = iter(loader)
        head = plain([next(iterator) for _ in range(k)])
        state = pickle.loads(pickle.dumps(loader.state_dict()))
    with DataLoader(fanned_out(sizes, 3), between(), seed=4) as loader:
        loader.load_state_dict(state)
        if iterate:
            iter(loader)
        state = pickle.loads(pickle.dumps(loader.state_dict()))
    with DataLoader(fanned_out(sizes, 3), then(), seed=4) as resumed:
        resumed.load_state_dict(state)
        return head + plain(list(resumed)), expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["in-process", "chunked", "threads"])
def test_a_state_saved_right_after_loading_one_is_the_loaded_one(kind):
    """Saved before ``iter()``, the state was the epoch's start: the next resume
    replayed every batch before the loaded checkpoint (1 batch, then 15 from the start)."""

    def service():
        return {
            "in-process": lambda: None,
            "chunked": lambda: MultiProcessingReadingService(2, strategy="chunked", timeout=20),
            "threads": lambda: ThreadReadingService(2),
        }[kind]()

    got, expected = resumed_twice(service, service, service, 1, iterate=False)
    assert got == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize("k", [1, 3])
def test_a_state_saved_before_a_resumes_skip_is_passed_keeps_it(k):
    """Threads (and classic's per-item merge) skip the outputs of the checkpoint's
    position delivered before it at the first ``next()``; a state saved before that
    said none were delivered: resumed under classic, 3 batches came twice."""

    def threads():
        return ThreadReadingService(2)

    def classic():
        return MultiProcessingReadingService(2, strategy="classic", timeout=20)

    got, expected = resumed_twice(threads, threads, classic, k, iterate=True)
    assert got == expected
