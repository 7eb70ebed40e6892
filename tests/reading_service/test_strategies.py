"""The economic and chunked strategies: same output as in-process, bounded work, failures."""

from __future__ import annotations

import multiprocessing
import os
import random

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import pipeloom
from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.datapipes.runtime import key_position
from pipeloom.errors import PlanError, WorkerError
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from pipeloom.reading_service.services import processes
from pipeloom.reading_service.strategies.dispatch.chain import BatchFeed, TaskFeed, WorkerChain
from pipeloom.reading_service.strategies.dispatch.dispatcher import Dispatcher
from pipeloom.reading_service.strategies.dispatch.relay import Cut
from pipeloom.reading_service.workers.failure import Failure
from pipeloom.reading_service.workers.messages import MAIN, BatchResult, BatchSize, Relay, Task
from tests.reading_service import pipelines
from tests.reading_service.resuming import resume_case


def plain(value):
    """Tensors as lists, so batches compare with ==."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


# Economic with its default (whole batches in item workers on a machine this size) and
# with batch workers: the two ways it builds batches.
ECONOMIC_WAYS = {"economic": {}, "economic+batch workers": {"num_batch_workers": 2}}


def strategy_args(strategy, chunk=None):
    """Service keyword arguments for a strategy name (``ECONOMIC_WAYS`` or chunked)."""
    if strategy == "chunked":
        return {"strategy": "chunked", **({} if chunk is None else {"chunk_size": chunk})}
    return {"strategy": "economic", **ECONOMIC_WAYS[strategy]}


def run(pipe, service, seed=5, epochs=1):
    with DataLoader(pipe, service, seed=seed) as loader:
        return [plain(list(loader)) for _ in range(epochs)]


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(0, 30),
    batch=st.integers(1, 6),
    drop_last=st.booleans(),
    map_style=st.booleans(),
    workers=st.integers(1, 3),
    strategy=st.sampled_from([*ECONOMIC_WAYS, "chunked"]),
    chunk=st.integers(1, 6),
)
def test_every_strategy_yields_the_in_process_batches(
    n, batch, drop_last, map_style, workers, strategy, chunk
):
    def build():
        return pipelines.for_strategies(n, batch, drop_last, map_style)

    expected = run(build(), None, epochs=2)
    args = strategy_args(strategy, min(chunk, batch))
    service = MultiProcessingReadingService(workers, timeout=30, **args)
    assert run(build(), service, epochs=2) == expected


@pytest.mark.parametrize("strategy", ["classic", "economic", "chunked"])
@pytest.mark.parametrize("method", ["spawn"])
def test_the_three_strategies_agree_under_spawn(strategy, method):
    expected = run(pipelines.for_strategies(), None)
    service = MultiProcessingReadingService(2, start_method=method, strategy=strategy, timeout=60)
    assert run(pipelines.for_strategies(), service) == expected


@pytest.mark.parametrize("strategy", [*ECONOMIC_WAYS, "chunked"])
def test_persistent_workers_drop_the_work_of_an_abandoned_epoch(strategy):
    expected = run(pipelines.for_strategies(40), None, epochs=3)
    service = MultiProcessingReadingService(
        3, persistent_workers=True, timeout=30, **strategy_args(strategy)
    )
    with DataLoader(pipelines.for_strategies(40), service, seed=5) as loader:
        got = []
        for epoch in range(3):
            iterator = iter(loader)
            next(iterator)  # abandon after one batch, with work in flight
            loader.set_epoch(epoch)
            got.append(plain(list(loader)))
    assert got == expected


def test_get_worker_info_in_item_workers():
    pipe = IterableWrapper(range(12)).sharding_filter().map(pipelines.pid_of_worker).batch(3)
    service = MultiProcessingReadingService(3, strategy="economic", timeout=30)
    with DataLoader(pipe, service, seed=0) as loader:
        batches = list(loader)
    assert len({pid for batch in batches for pid in batch}) >= 2  # spread over item workers


@pytest.mark.parametrize("strategy", ["economic", "chunked"])
def test_a_worker_exception_surfaces_in_order_naming_the_worker_block_and_item(strategy):
    pipe = IterableWrapper(range(20)).sharding_filter().map(pipelines.explode_at_seven).batch(2)
    service = MultiProcessingReadingService(2, strategy=strategy, timeout=30)
    delivered = []
    with DataLoader(pipe, service, seed=0) as loader:
        with pytest.raises(KeyError, match="bad sample") as info:
            for batch in loader:
                delivered.append(batch)
    assert delivered == [[0, 1], [2, 3], [4, 5]]  # everything before the failing batch
    message = str(info.value)
    assert "item worker" in message and "explode_at_seven" in message
    assert "position 7" in message
    assert isinstance(info.value.__cause__, WorkerError)


def until_error(pipe, service, seed=5):
    """The batches delivered before the loader raised, the error, and the state before it
    (saved after the last batch: no state can be saved once an error escaped)."""
    delivered = []
    with DataLoader(pipe, service, seed=seed) as loader:
        state = loader.state_dict()
        with pytest.raises(Exception) as info:
            for batch in loader:
                delivered.append(plain(batch))
                state = loader.state_dict()
        return delivered, info.value, state


@settings(max_examples=20, deadline=None)
@given(
    at=st.integers(0, 13),
    batch=st.integers(1, 5),
    workers=st.integers(1, 3),
    strategy=st.sampled_from([*ECONOMIC_WAYS, "chunked"]),
    chunk=st.integers(1, 5),
)
def test_a_source_error_comes_after_every_batch_made_before_it(at, batch, workers, strategy, chunk):
    n = 14
    expected, error, _ = until_error(pipelines.source_error_after(n, batch, at), None)
    args = strategy_args(strategy, min(chunk, batch))
    service = MultiProcessingReadingService(workers, timeout=30, **args)
    delivered, got, _ = until_error(pipelines.source_error_after(n, batch, at), service)
    assert delivered == expected
    assert type(got) is type(error) and str(got).startswith(str(error))


def test_classic_raises_a_source_error_after_the_batches_made_before_it():
    expected, _, _ = until_error(pipelines.source_error_after(14, 1, 2), None)
    service = MultiProcessingReadingService(2, timeout=30, strategy="classic")
    assert until_error(pipelines.source_error_after(14, 1, 2), service)[0] == expected


def _fails_at(limit):
    def check(x):
        if x == limit:
            raise ValueError(f"item {x} is bad")
        return x

    return check


@settings(max_examples=15, deadline=None)
@example(at=5, source_error=False, batch=1, workers=2, threads=False)  # lost [4] before
@example(at=5, source_error=False, batch=1, workers=2, threads=True)
@given(
    at=st.integers(0, 13),
    source_error=st.booleans(),
    batch=st.integers(1, 4),
    workers=st.integers(1, 3),
    threads=st.booleans(),
)
def test_classic_and_threads_raise_an_error_after_every_batch_made_before_it(
    at, source_error, batch, workers, threads
):
    """Each worker meets an error at its own place; the merge raises it at the item's
    position, so the batches of other workers that come before it are not lost."""

    def pipeline():
        if source_error:
            return pipelines.source_error_after(14, batch, at)
        return IterableWrapper(range(14)).sharding_filter().map(_fails_at(at)).batch(batch)

    expected, error, _ = until_error(pipeline(), None)
    if threads:
        service = ThreadReadingService(workers)
    else:
        service = MultiProcessingReadingService(workers, timeout=30, strategy="classic")
    delivered, got, _ = until_error(pipeline(), service)
    assert delivered == expected
    assert type(got) is type(error) and str(got).startswith(str(error))


@pytest.mark.parametrize("strategy", ["classic", *ECONOMIC_WAYS, "chunked"])
def test_resume_after_a_source_error_yields_the_batches_after_those_delivered(strategy):
    n, batch, at = 20, 3, 10
    expected = run(pipelines.source_error_after(n, batch, n), None)[0]
    args = {"strategy": "classic"} if strategy == "classic" else strategy_args(strategy, 2)
    service = MultiProcessingReadingService(2, timeout=30, **args)
    head, _, state = until_error(pipelines.source_error_after(n, batch, at), service)
    assert head == expected[: at // batch]
    service = MultiProcessingReadingService(3, timeout=30, **args)
    with DataLoader(pipelines.source_error_after(n, batch, n), service, seed=5) as resumed:
        resumed.load_state_dict(state)
        assert head + plain(list(resumed)) == expected


@pytest.mark.parametrize("strategy", ["economic", "chunked"])
def test_a_killed_item_worker_raises_naming_it(strategy):
    pipe = IterableWrapper(range(50)).sharding_filter().map(pipelines.kill_self_at).batch(2)
    service = MultiProcessingReadingService(2, strategy=strategy, timeout=30)
    with DataLoader(pipe, service, seed=0) as loader:
        with pytest.raises(WorkerError, match=r"item worker \d \(pid \d+\) was killed by signal"):
            list(loader)


def test_a_killed_batch_worker_raises_naming_it():
    pipe = (
        IterableWrapper(range(50))
        .sharding_filter()
        .batch(2)
        .collate(pipelines.kill_self_in_collate)
    )
    service = MultiProcessingReadingService(2, strategy="economic", num_batch_workers=2, timeout=30)
    with DataLoader(pipe, service, seed=0) as loader:
        with pytest.raises(WorkerError, match=r"batch worker \d \(pid \d+\) was killed by signal"):
            list(loader)


@pytest.mark.parametrize("strategy", ["economic", "chunked"])
def test_break_and_shutdown_leave_no_process(strategy):
    service = MultiProcessingReadingService(2, strategy=strategy, timeout=30)
    with DataLoader(pipelines.for_strategies(200), service, seed=0) as loader:
        for i, _ in enumerate(loader):
            if i == 2:
                break
        assert len(list(loader)) == 50
    assert multiprocessing.active_children() == []


def test_placement_names_item_and_batch_workers():
    pipe = IterableWrapper(range(8)).shuffle().sharding_filter().map(abs).batch(2).collate()
    service = MultiProcessingReadingService(2, strategy="economic", num_batch_workers=2)
    with DataLoader(pipe, service, seed=0) as loader:
        where = {type(b).__name__: place for b, place in loader.placement().locations}
    assert where["ShardingFilter"] == "main process" and where["Shuffler"] == "main process"
    assert where["Mapper"].startswith("item worker processes x2")
    assert where["Batcher"] == where["Collator"] == "batch workers x2"


def collated_where(batch):
    """``(pid collating, pids that made the items, the items)``."""
    return (os.getpid(), {pid for _, pid, _ in batch}, [x for x, _, _ in batch])


def test_without_batch_workers_item_workers_build_and_collate_whole_batches():
    pipe = (
        IterableWrapper(range(40))
        .sharding_filter()
        .map(pipelines.pid_of_worker)
        .batch(4)
        .collate(collated_where)
    )
    service = MultiProcessingReadingService(
        2, strategy="economic", num_batch_workers=0, persistent_workers=True, timeout=30
    )
    with DataLoader(pipe, service, seed=0, stats=True) as loader:
        where = {type(b).__name__: place for b, place in loader.placement().locations}
        batches = list(loader)
        queues = {q.name for q in loader.stats().queues}
        children = {p.pid for p in multiprocessing.active_children()}
    assert where["Mapper"] == where["Batcher"] == where["Collator"]
    assert where["Collator"].startswith("item worker processes x2")
    assert [x for _, _, items in batches for x in items] == list(range(40))
    assert all(made == {collator} for collator, made, _ in batches)  # one worker per batch
    assert {collator for collator, _, _ in batches} == children  # spread over both
    assert len(children) == 2 and not any("batch worker" in name for name in queues)


def test_chunked_builds_the_first_batch_from_chunks_and_later_ones_in_item_workers():
    pipe = (
        IterableWrapper(range(24))
        .sharding_filter()
        .map(pipelines.pid_of_worker)
        .batch(6)
        .collate(collated_where)
    )
    service = MultiProcessingReadingService(
        3, strategy="chunked", chunk_size=2, persistent_workers=True, timeout=30
    )
    with DataLoader(pipe, service, seed=0) as loader:
        where = {type(b).__name__: place for b, place in loader.placement().locations}
        first, *later = list(loader)
        children = {p.pid for p in multiprocessing.active_children()}
    assert where["Collator"].startswith("item worker processes x3")
    assert [x for _, _, items in [first, *later] for x in items] == list(range(24))
    collator, made, _ = first
    assert collator == os.getpid() and len(made) >= 2  # chunks from several workers
    assert made <= children
    assert all(made == {collator} and collator in children for collator, made, _ in later)


@pytest.mark.parametrize(
    "workers, prefetch, cores, expected",
    [(2, 2, 2, 0), (4, 2, 2, 0), (2, 2, 16, 0), (8, 2, 16, 2), (8, 4, 3, 0), (8, 3, 16, 3)],
)
def test_batch_workers_by_default_only_when_prefetched_batches_cannot_fill_the_cores(
    monkeypatch, workers, prefetch, cores, expected
):
    monkeypatch.setattr(processes, "_usable_cores", lambda: cores)
    service = MultiProcessingReadingService(workers, prefetch, strategy="economic")
    assert service.num_batch_workers == expected


# -- bad input ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"strategy": "fast"}, ValueError, "strategy must be one of 'classic', 'economic'"),
        ({"chunk_size": 0, "strategy": "chunked"}, ValueError, "chunk_size must be an int >= 1"),
        ({"chunk_size": 2}, ValueError, "chunk_size only applies to strategy='chunked'"),
        ({"num_batch_workers": 2}, ValueError, "num_batch_workers only applies to strategy="),
        ({"num_batch_workers": -1, "strategy": "economic"}, ValueError, "must be an int >= 0"),
        ({"strategy": "economic", "in_order": False}, ValueError, "in_order=False only"),
    ],
)
def test_bad_strategy_arguments_are_explained(kwargs, error, message):
    with pytest.raises(error, match=message):
        MultiProcessingReadingService(2, **kwargs)


def test_more_batch_workers_than_prefetch_factor_warns_that_they_cannot_help():
    with pytest.warns(UserWarning, match="extra batch workers stay idle"):
        MultiProcessingReadingService(
            2, prefetch_factor=2, strategy="economic", num_batch_workers=3
        )


@pytest.mark.parametrize("strategy", ["economic", "chunked"])
def test_no_batching_point_says_what_is_missing(strategy):
    pipe = IterableWrapper(range(8)).sharding_filter().map(abs)
    with pytest.raises(ValueError, match=r"needs \.batch\(n\) right after the per-item"):
        DataLoader(pipe, MultiProcessingReadingService(2, strategy=strategy))  # refused here


def test_economic_refuses_a_filter_before_the_batch_and_names_it():
    pipe = IterableWrapper(range(8)).sharding_filter().filter(bool).batch(2)
    # PlanError: importable from pipeloom.errors (docs name it), and still a ValueError
    with pytest.raises(PlanError, match=r"exactly one output per input, but Filter"):
        DataLoader(pipe, MultiProcessingReadingService(2, strategy="economic"))
    assert issubclass(PlanError, ValueError)


def test_chunked_handles_a_filter_before_the_batch():
    def build():
        return IterableWrapper(range(30)).sharding_filter().filter(lambda x: x % 3 != 0).batch(4)

    expected = run(build(), None)
    service = MultiProcessingReadingService(3, strategy="chunked", chunk_size=2, timeout=30)
    assert run(build(), service) == expected


def test_chunk_size_larger_than_the_batch_is_refused():
    pipe = IterableWrapper(range(8)).sharding_filter().batch(2)
    service = MultiProcessingReadingService(2, strategy="chunked", chunk_size=3)
    with pytest.raises(ValueError, match=r"chunk_size must be at most the batch size \(2\)"):
        DataLoader(pipe, service)


# -- the dispatcher's book-keeping, without processes ---------------------------------


class FakePool:
    """Records what the dispatcher hands out; workers answer when told to."""

    def __init__(self, item_workers: int, batch_workers: int) -> None:
        self.num_item_workers = item_workers
        self.num_batch_workers = batch_workers
        self.tasks: list[tuple[int, Task]] = []
        self.controls: list[tuple[int, BatchSize]] = []
        self.outbox: list[BatchResult] = []

    def send_task(self, worker, message):
        self.tasks.append((worker, message))

    def send_control(self, worker, message):
        self.controls.append((worker, message))

    def receive(self):
        out, self.outbox = self.outbox, []
        return out

    def check_alive(self):
        pass

    def readiness(self):
        return []

    def finish_batches(self):
        """Batch workers answer every batch announced so far (one batch per unit)."""
        items = {}
        for _, task in self.tasks:
            items.setdefault(task.unit, []).extend(task.entries)
        for _, size in self.controls:
            entries = sorted(items[size.unit])
            outputs = [(entries[0][0], 0, [v for _, v in entries])]
            self.outbox.append(BatchResult(size.gen, size.unit, outputs))
        self.controls = []


def test_economic_keeps_at_most_prefetch_batches_in_flight_and_balances_items():
    pool = FakePool(item_workers=4, batch_workers=2)
    dispatcher = Dispatcher(unit_size=4, max_units=2, per_item_tasks=True, units_are_batches=True)
    dispatcher.attach(IterableWrapper(range(40)), pool, gen=1, seed=None, epoch=0)
    with pytest.raises(pipeloom.errors.NotAvailable):
        dispatcher.async_next()
    entries = [(worker, entry) for worker, task in pool.tasks for entry in task.entries]
    assert len(entries) == 8  # 2 batches x 4 items, no more
    first_batch_workers = [worker for worker, _ in entries[:4]]
    assert sorted(first_batch_workers) == [0, 1, 2, 3]  # built by every item worker at once
    assert sorted(worker for worker, _ in pool.controls) == [0, 1]  # one batch per batch worker
    pool.finish_batches()
    assert dispatcher.async_next() == [0, 1, 2, 3]
    assert dispatcher.async_next() == [4, 5, 6, 7]
    with pytest.raises(pipeloom.errors.NotAvailable):
        dispatcher.async_next()
    assert sum(len(task.entries) for _, task in pool.tasks) == 16  # room for two more


def test_chunked_hands_whole_chunks_to_the_least_loaded_worker():
    pool = FakePool(item_workers=3, batch_workers=0)
    dispatcher = Dispatcher(unit_size=2, max_units=4, per_item_tasks=False, units_are_batches=False)
    dispatcher.attach(IterableWrapper(range(9)), pool, gen=1, seed=None, epoch=0)
    with pytest.raises(pipeloom.errors.NotAvailable):
        dispatcher.async_next()
    assert [(w, task.unit, task.dest, task.entries) for w, task in pool.tasks] == [
        (0, 0, MAIN, [(0, 0), (1, 1)]),
        (1, 1, MAIN, [(2, 2), (3, 3)]),
        (2, 2, MAIN, [(4, 4), (5, 5)]),
        (0, 3, MAIN, [(6, 6), (7, 7)]),
    ]


def fail_at_5(x):
    if x == 5:
        raise KeyError("five")
    return x


@pytest.mark.parametrize("fails", [False, True])
def test_the_next_unit_goes_out_when_one_is_taken_and_a_source_error_waits_its_turn(fails):
    pool = FakePool(item_workers=2, batch_workers=0)
    dispatcher = Dispatcher(unit_size=2, max_units=2, per_item_tasks=False, units_are_batches=False)
    source = IterableWrapper(range(10))
    dispatcher.attach(source.map(fail_at_5) if fails else source, pool, gen=1, seed=None, epoch=0)
    with pytest.raises(pipeloom.errors.NotAvailable):
        dispatcher.async_next()
    assert [task.unit for _, task in pool.tasks] == [0, 1]
    pool.outbox.append(BatchResult(1, 0, [(0, 0, "a"), (1, 0, "b")]))
    assert dispatcher.async_next() == "a"
    if not fails:  # unit 2 left before the consumer's next call
        assert [task.unit for _, task in pool.tasks] == [0, 1, 2]
        return
    assert dispatcher.async_next() == "b"  # what was taken comes first, as in-process
    # The source failed after item 4: unit 2 holds it alone, and goes out as chunks do.
    assert [task.unit for _, task in pool.tasks] == [0, 1, 2]
    with pytest.raises(pipeloom.errors.NotAvailable):  # units 1 and 2 come before the error
        dispatcher.async_next()
    pool.outbox.append(BatchResult(1, 1, [(2, 0, "c"), (3, 0, "d")]))
    pool.outbox.append(BatchResult(1, 2, [(4, 0, "e")]))
    assert [dispatcher.async_next() for _ in range(3)] == ["c", "d", "e"]
    with pytest.raises(KeyError, match="five"):
        dispatcher.async_next()


def test_chunked_hands_out_the_first_batch_in_chunks_and_batches_it_itself(global_rngs_kept):
    pool = FakePool(item_workers=3, batch_workers=0)
    dispatcher = Dispatcher(
        unit_size=4,
        max_units=2,
        per_item_tasks=False,
        units_are_batches=True,
        first_unit_chunk=2,
        batch_chain=BatchFeed().batch(4),
    )
    dispatcher.attach(IterableWrapper(range(10)), pool, gen=1, seed=None, epoch=0)
    with pytest.raises(pipeloom.errors.NotAvailable):
        dispatcher.async_next()
    sent = [(worker, task.unit, task.whole, task.entries) for worker, task in pool.tasks]
    first, second = sent[0], sent[1]
    assert first[1:] == (0, False, [(0, 0), (1, 1)])  # chunks of the first batch
    assert second[1:] == (1, False, [(2, 2), (3, 3)])
    assert first[0] != second[0]  # on two workers
    # then whole batches, 2 in flight (the first batch's chunks count as one)
    assert [(t[1], t[2], [p for p, _ in t[3]]) for t in sent[2:]] == [(2, True, [4, 5, 6, 7])]
    pool.outbox.append(BatchResult(1, 1, [(2, 0, "c"), (3, 0, "d")]))
    with pytest.raises(pipeloom.errors.NotAvailable):  # chunk 0 not in yet
        dispatcher.async_next()
    pool.outbox.append(BatchResult(1, 0, [(0, 0, "a"), (1, 0, "b")]))
    assert dispatcher.async_next() == ["a", "b", "c", "d"]  # batched here
    assert dispatcher.resume_from == (4, 0, 0)
    pool.outbox.append(BatchResult(1, 2, [(7, 0, "whole")]))
    assert dispatcher.async_next() == "whole"
    assert [t.entries[0][0] for _, t in pool.tasks[3:]] == [8]  # the last, short batch
    pool.outbox.append(BatchResult(1, 3, [(9, 0, "end")]))
    assert dispatcher.async_next() == "end"
    with pytest.raises(StopIteration):
        dispatcher.async_next()


@pytest.fixture
def global_rngs_kept():
    """Give the test process's global RNGs back as they were (the chain seeds them)."""
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    yield
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])


@pytest.mark.parametrize("told", [True, False])
def test_a_worker_chain_told_of_outside_rng_moves_stays_unseeded(told, global_rngs_kept):
    calls = []

    def counted(x):
        calls.append(x)
        return x

    chain = WorkerChain(TaskFeed().map(counted))
    chain.start_epoch(1, 0, 5)
    assert [item for _, _, item in chain.run(1, [(0, 10), (1, 11)], "test")] == [10, 11]
    random.random()  # the batch part, run after the items, moved the global RNGs
    if told:
        chain.global_rngs_moved()
    assert [item for _, _, item in chain.run(1, [(2, 12), (3, 13)], "test")] == [12, 13]
    # told: each item once; not told: the move looks like the items' draws, so the
    # task runs again seeded item by item (and so will every later task)
    assert calls == ([10, 11, 12, 13] if told else [10, 11, 12, 13, 12, 13])


def fail_at_12(x):
    if x == 12:
        raise KeyError("twelve")
    return x * 2


TASKS = {
    "a run": [(3, 10), (4, 11), (5, 12), (6, 13)],
    "gaps": [(3, 10), (5, 11), (6, 12), (9, 13)],
    "keys": [((3, 0), 10), ((3, 1), 11), ((4, 0), 12), ((5, 0), 13)],
}


@pytest.mark.parametrize("seed", [None, 5])
@pytest.mark.parametrize("task", sorted(TASKS))
def test_a_worker_chain_gives_each_output_its_key_whether_or_not_the_task_is_one_run(
    task, seed, global_rngs_kept
):
    entries = TASKS[task]
    chain = WorkerChain(TaskFeed().map(lambda x: x * 2))
    chain.start_epoch(1, 0, seed)
    assert chain.run(1, entries, "test") == [(key, 0, value * 2) for key, value in entries]
    chain = WorkerChain(TaskFeed().map(fail_at_12))
    chain.start_epoch(1, 0, seed)
    failure = chain.run(1, entries, "test")
    assert isinstance(failure, Failure) and "twelve" in failure.message
    assert failure.item == key_position(entries[2][0])  # the failing item's position


@pytest.mark.parametrize(("task", "one_loop"), [("a run", True), ("gaps", False), ("keys", False)])
def test_only_a_task_of_consecutive_positions_is_read_as_one_span(task, one_loop):
    feed = TaskFeed()
    feed.load(TASKS[task], None)
    assert (feed._run_head() is not None) == one_loop
    feed.load(TASKS["a run"], 5)  # seeded per item: read item by item
    assert feed._run_head() is None
    feed.reseed = False
    assert feed._run_head() is not None


class NoDeepCopy(torch.utils.data.Dataset):
    """A dataset whose deep copy is counted (in the process that makes it)."""

    copies = 0

    def __init__(self, n):
        self.rows = list(range(n))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index] * 10

    def __deepcopy__(self, memo):
        type(self).copies += 1
        clone = NoDeepCopy(0)
        clone.rows = list(self.rows)
        return clone


@pytest.mark.parametrize("strategy", [*ECONOMIC_WAYS, "chunked"])
def test_the_workers_part_refers_to_the_dataset_instead_of_deep_copying_it(strategy):
    dataset = NoDeepCopy(12)
    pipe = IterableWrapper(list(range(12))).sharding_filter().map(dataset.__getitem__).batch(4)
    NoDeepCopy.copies = 0
    service = MultiProcessingReadingService(2, timeout=30, **strategy_args(strategy))
    assert run(pipe, service) == [[[0, 10, 20, 30], [40, 50, 60, 70], [80, 90, 100, 110]]]
    assert NoDeepCopy.copies == 0  # the start-up cost grew with the dataset


def test_map_style_sources_send_indices_not_items():
    pipe = pipelines.PidOnRead(list(range(6))).to_iter().batch(3)
    service = MultiProcessingReadingService(2, strategy="economic", timeout=30)
    pids = {pid for batch in run(pipe, service)[0] for pid in batch}
    assert os.getpid() not in pids and len(pids) >= 1  # read in item workers only


# -- checkpoints -----------------------------------------------------------------------


@settings(max_examples=10, deadline=None)
@given(
    stop=st.integers(0, 8),
    workers=st.integers(1, 3),
    strategy=st.sampled_from([*ECONOMIC_WAYS, "chunked"]),
    map_style=st.booleans(),
    chunk=st.integers(1, 4),
)
def test_resume_at_any_step_equals_the_uninterrupted_epoch(
    stop, workers, strategy, map_style, chunk
):
    args = strategy_args(strategy, chunk)

    def build():
        return pipelines.for_strategies(29, 4, map_style=map_style)

    def service():
        return MultiProcessingReadingService(workers, timeout=30, **args)

    resume_case(build, service, stop, compare=plain)


def test_a_relayed_chunk_counts_a_positions_outputs_from_where_the_last_chunk_left_off():
    # A position's outputs may span two chunks (several records of one file): the next
    # chunk's resume points and the outputs still to drop after a resume go on counting.
    first = Cut(Relay(0, -1, [], []), skip=3)
    for j in range(2):
        first.add(((5, j), 0, j))
    assert first.items == []
    second = Cut(first.relay(0, 0, 0), 0)
    for key in [(5, 2), (5, 3), (6, 0)]:
        second.add((key, 0, key))
    assert [key for key, _, _ in second.items] == [(5, 3), (6, 0)]
    assert second.after == [(5, 4), (6, 1)]


@pytest.mark.parametrize("stop", [0, 3, 7])
def test_chunked_resumes_inside_a_chunk_with_filters_and_flatmaps(stop):
    def service():
        return MultiProcessingReadingService(2, strategy="chunked", chunk_size=3, timeout=30)

    resume_case(pipelines.augmented, service, stop)


# -- a streaming source with an on_error="skip" policy -----------------------------------


def tar_pipeline(root):
    from pipeloom.datapipes import FileLister

    return (
        FileLister(str(root), "*.tar")
        .sharding_filter()
        .open_files("rb")
        .load_from_tar(on_error="skip")
        .map(pipelines.member_name)
        .batch(3)
    )


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("strategy", ["classic", "chunked"])
def test_a_skipped_corrupt_shard_loses_or_duplicates_no_batch(tmp_path, strategy):
    import io
    import tarfile

    for shard in range(5):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for i in range(4):
                data = bytes([shard, i]) * (i * 300)
                info = tarfile.TarInfo(f"s{shard}-{i}.bin")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        payload = buffer.getvalue()
        if shard == 2:
            payload = payload[:1500]  # keeps two members, then corrupt
        (tmp_path / f"shard-{shard}.tar").write_bytes(payload)
    expected = run(tar_pipeline(tmp_path), None)[0]
    names = [name for batch in expected for name in batch]
    assert len(names) == len(set(names)) == 17  # 4 whole shards x 4 + 1 before the cut
    service = MultiProcessingReadingService(3, strategy=strategy, timeout=30)
    assert run(tar_pipeline(tmp_path), service) == [expected]


def test_economic_says_a_tar_reader_before_the_batch_needs_chunked(tmp_path):
    service = MultiProcessingReadingService(2, strategy="economic")
    with pytest.raises(ValueError, match=r"TarArchiveLoader.*strategy='chunked'"):
        DataLoader(tar_pipeline(tmp_path), service)


def collate_drawing(batch):
    """A collate function with a random part (e.g. mixup) drawn from the global RNGs."""
    return (list(batch), random.random(), torch.rand(1).item())


def test_economic_collate_draws_are_the_same_with_or_without_batch_workers():
    def build():
        return IterableWrapper(range(24)).sharding_filter().batch(4).collate(collate_drawing)

    runs = []
    for workers, batch_workers in [(1, 0), (3, 0), (2, 2), (3, 1)]:
        service = MultiProcessingReadingService(
            workers, strategy="economic", num_batch_workers=batch_workers, timeout=30
        )
        runs.append(run(build(), service, seed=9, epochs=2))
    assert all(got == runs[0] for got in runs[1:])
    draws = [batch[1] for batch in runs[0][0]]
    assert len(set(draws)) == len(draws)  # a draw of its own for each batch


def test_chunked_collate_draws_are_economics_and_leave_the_main_process_rngs_alone():
    def build():
        return IterableWrapper(range(24)).sharding_filter().batch(4).collate(collate_drawing)

    economic = MultiProcessingReadingService(2, strategy="economic", timeout=30)
    expected = run(build(), economic, seed=9, epochs=2)
    for workers, chunk in [(1, None), (3, 2), (2, 1)]:
        service = MultiProcessingReadingService(
            workers, timeout=30, **strategy_args("chunked", chunk)
        )
        with DataLoader(build(), service, seed=9) as loader:
            before = (random.getstate(), torch.get_rng_state())
            got = [plain(list(loader)) for _ in range(2)]  # the first batch collated here
            assert (random.getstate(), torch.get_rng_state().tolist()) == (
                before[0],
                before[1].tolist(),
            )
        assert got == expected


@pytest.mark.parametrize("strategy", [*ECONOMIC_WAYS, "chunked"])
def test_global_rng_draws_depend_on_the_item_not_on_the_worker_or_timing(strategy):
    def build():
        return IterableWrapper(range(24)).sharding_filter().map(pipelines.global_draws).batch(4)

    runs = []
    for workers in (1, 3):
        args = strategy_args(strategy, 2)
        service = MultiProcessingReadingService(workers, timeout=30, **args)
        runs.append(run(build(), service, seed=9, epochs=2))
    assert runs[0] == runs[1]
    epoch0, epoch1 = runs[0]
    assert epoch0 != epoch1  # fresh draws each epoch
    draws = [tuple(d) for batch in epoch0 for d in batch]
    assert len(set(draws)) == len(draws)  # and for each item
