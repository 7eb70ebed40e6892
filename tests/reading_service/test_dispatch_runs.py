"""Economic and chunked hand out runs of positions and send a task's outputs as one message."""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, SequenceWrapper, reset_pipeline, seed_pipeline
from pipeloom.datapipes.runtime import RunReader, current_stamp
from pipeloom.reading_service import InProcessReadingService, MultiProcessingReadingService
from pipeloom.reading_service.strategies.dispatch.packing import PackedOutputs, pack, unpack
from pipeloom.testing import check_same_output_everywhere


def row(index):
    return torch.arange(4, dtype=torch.float32) + index


def rows(n=23, batch=5):
    return IterableWrapper(list(range(n))).sharding_filter().map(row).batch(batch).collate()


def map_style_rows(n=23, batch=5):
    return SequenceWrapper(list(range(n))).to_iter().map(row).batch(batch)


# -- reading a run of positions in the main process ---------------------------------------
def started(pipe):
    seed_pipeline(pipe, 0)
    reset_pipeline(pipe)
    return pipe


def test_a_sharding_root_over_a_list_gives_its_positions_and_values_in_one_slice():
    pipe = started(IterableWrapper(list("abcdefg")).sharding_filter())
    reader = RunReader(pipe)
    assert reader.positioned(3) == (range(0, 3), ["a", "b", "c"])
    assert current_stamp()[2] == 2
    assert reader.positioned(10) == (range(3, 7), ["d", "e", "f", "g"])
    with pytest.raises(StopIteration):
        reader.positioned(1)


def test_a_shard_of_a_list_gives_its_own_positions():
    pipe = IterableWrapper(list(range(10))).sharding_filter()
    pipe.sharding_settings(3, 1)
    started(pipe)
    positions, values = RunReader(pipe).positioned(10)
    assert list(positions) == [1, 4, 7] and values == [1, 4, 7]


def test_a_run_with_a_stage_or_an_iterator_is_read_item_by_item():
    with_stage = started(IterableWrapper(list(range(5))).sharding_filter().map(abs))
    assert RunReader(with_stage).positioned(3) is None
    iterated = started(IterableWrapper(iter(range(5))).sharding_filter())
    assert RunReader(iterated).positioned(3) is None


# -- packing a task's outputs ---------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(count=st.integers(0, 6), shape=st.lists(st.integers(0, 3), max_size=3))
def test_packed_outputs_unpack_to_equal_tensors(count, shape):
    outputs = [(k, k % 2, torch.full(shape, float(k))) for k in range(count)]
    back = unpack(pickle.loads(pickle.dumps(pack(outputs))))
    assert [(k, d) for k, d, _ in back] == [(k, d) for k, d, _ in outputs]
    assert all(torch.equal(a[2], b[2]) for a, b in zip(back, outputs))


@pytest.mark.parametrize(
    "items",
    [
        [torch.ones(2), torch.ones(3)],  # shapes differ
        [torch.ones(2), torch.ones(2, dtype=torch.int64)],  # dtypes differ
        [torch.ones(2), [1.0, 1.0]],  # not a tensor
        [torch.ones(2), torch.nn.Parameter(torch.ones(2))],  # a subclass
        [torch.ones(2), torch.ones(2, requires_grad=True)],  # must fail to send, as before
        [torch.ones(2)],  # nothing to gain
    ],
)
def test_outputs_that_do_not_stack_exactly_cross_as_they_are(items):
    outputs = [(k, 0, item) for k, item in enumerate(items)]
    assert pack(outputs) is outputs


def test_pack_makes_one_tensor():
    packed = pack([(0, 0, torch.ones(2)), (1, 0, torch.ones(2))])
    assert isinstance(packed, PackedOutputs) and packed.items.shape == (2, 2)


# -- end to end ---------------------------------------------------------------------------
@pytest.mark.timeout(240)
@pytest.mark.parametrize("make", [rows, map_style_rows])
def test_runs_of_tensors_give_the_in_process_batches_everywhere(make):
    ran = check_same_output_everywhere(make, epochs=2)
    assert {"economic", "chunked"} <= set(ran)


def _epochs(loader, epochs):
    return [[b.tolist() for b in loader] for _ in range(epochs)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy", ["economic", "chunked"])
def test_resume_at_every_step_under_another_worker_count(strategy):
    def service(workers, persistent=False):
        extra = {"chunk_size": 3} if strategy == "chunked" else {}
        return MultiProcessingReadingService(
            workers, strategy=strategy, timeout=60, persistent_workers=persistent, **extra
        )

    with DataLoader(rows(), InProcessReadingService(), seed=3) as loader:
        expected = _epochs(loader, 2)[1]
    with DataLoader(rows(), service(2, persistent=True), seed=3) as loader:
        list(loader)
        states, seen = [], []
        iterator = iter(loader)
        states.append(pickle.dumps(loader.state_dict()))
        for batch in iterator:
            seen.append(batch.tolist())
            states.append(pickle.dumps(loader.state_dict()))
    assert seen == expected
    for stop, state in enumerate(states):
        with DataLoader(rows(), service(3), seed=4) as resumed:
            resumed.load_state_dict(pickle.loads(state))
            assert expected[:stop] + [b.tolist() for b in resumed] == expected, stop


def draws_from_item_13(x):
    """Draws from the global RNGs only from item 13 on: later tasks than the first draw."""
    import random

    import numpy as np

    if x < 13:
        return (x, None)
    return (x, (random.random(), float(np.random.rand()), float(torch.rand(()))))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy", ["economic", "chunked"])
def test_global_draws_that_start_in_a_later_task_still_depend_on_the_item_only(strategy):
    def build():
        return IterableWrapper(list(range(30))).sharding_filter().map(draws_from_item_13).batch(4)

    runs = []
    for workers in (1, 3):
        extra = {"chunk_size": 2} if strategy == "chunked" else {}
        service = MultiProcessingReadingService(workers, strategy=strategy, timeout=60, **extra)
        with DataLoader(build(), service, seed=9) as loader:
            runs.append([list(loader) for _ in range(2)])
    assert runs[0] == runs[1]
    draws = [d for epoch in runs[0] for batch in epoch for _, d in batch if d is not None]
    assert len(draws) == 2 * 17 and len(set(draws)) == len(draws)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy", ["economic", "chunked"])
def test_a_killed_item_worker_raises_and_nothing_of_the_loader_is_left(strategy):
    import multiprocessing
    import os
    import signal

    from pipeloom.errors import WorkerError
    from tests.own_resources import OwnResources

    before = OwnResources()
    service = MultiProcessingReadingService(2, strategy=strategy, timeout=30)
    with DataLoader(rows(n=4000, batch=8), service, seed=0) as loader:
        iterator = iter(loader)
        next(iterator)
        (pid,) = [
            p.pid for p in multiprocessing.active_children() if p.name == "pipeloom-item-worker-0"
        ]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match=rf"item worker 0 \(pid {pid}\).*SIGKILL"):
            list(iterator)
    left = before.left_after(timeout=10.0)
    assert not left, left
