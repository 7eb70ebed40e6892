"""MultiProcessingReadingService: placement-independent output, lifecycle, failures."""

from __future__ import annotations

import gc
import multiprocessing
import os
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeloom
from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.errors import WorkerError
from pipeloom.reading_service import MultiProcessingReadingService
from tests.own_resources import OwnResources
from tests.reading_service import pipelines


@settings(max_examples=6, deadline=None)
@given(workers=st.integers(1, 3), seed=st.integers(0, 2**16), n=st.integers(0, 30))
def test_output_equals_in_process_at_any_worker_count(workers, seed, n):
    expected = list(DataLoader(pipelines.augmented(n), seed=seed))
    service = MultiProcessingReadingService(workers, start_method="fork")
    with DataLoader(pipelines.augmented(n), service, seed=seed) as loader:
        assert list(loader) == expected


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_lambdas_travel_under_spawn_and_forkserver(method):
    expected = list(DataLoader(pipelines.augmented(12), seed=1))
    service = MultiProcessingReadingService(2, start_method=method, timeout=60)
    with DataLoader(pipelines.augmented(12), service, seed=1) as loader:
        assert list(loader) == expected


def test_lazy_init_runs_in_the_worker_not_in_the_parent():
    source = pipelines.PidOfLazyInit(4)
    with DataLoader(source.sharding_filter(), MultiProcessingReadingService(2), seed=0) as loader:
        pids = set(loader)
    assert os.getpid() not in pids and len(pids) == 2 and source.pid is None


def test_per_worker_global_rngs_are_distinct_reseeded_each_epoch_and_reproducible():
    def run():
        pipe = IterableWrapper(range(4)).sharding_filter().map(pipelines.global_numpy_draw)
        with DataLoader(
            pipe, MultiProcessingReadingService(2, persistent_workers=True), seed=9
        ) as loader:
            return list(loader), list(loader)

    first_epoch, second_epoch = run()
    assert first_epoch[0] != first_epoch[1]  # worker 0 and worker 1 differ
    assert first_epoch != second_epoch  # a new epoch reseeds
    assert run() == (first_epoch, second_epoch)  # identical across runs


def test_get_worker_info_in_processes():
    pipe = IterableWrapper(range(4)).sharding_filter().map(_who)
    with DataLoader(pipe, MultiProcessingReadingService(2), seed=0) as loader:
        assert list(loader) == [(0, 2), (1, 2), (0, 2), (1, 2)]


def _who(_):
    info = pipeloom.get_worker_info()
    return (info.id, info.num_workers)


def test_worker_exception_reraises_with_type_traceback_block_and_item():
    pipe = IterableWrapper(range(10)).sharding_filter().map(pipelines.explode_at_seven)
    with DataLoader(pipe, MultiProcessingReadingService(2, timeout=30), seed=0) as loader:
        with pytest.raises(KeyError, match="bad sample") as info:
            list(loader)
    message = str(info.value)
    assert "worker process 1 (pid" in message and "Mapper(fn=explode_at_seven" in message
    assert "position 7" in message and "Traceback" in message
    assert isinstance(info.value.__cause__, WorkerError)


def test_a_killed_worker_raises_naming_it_and_the_signal():
    pipe = IterableWrapper(range(50)).sharding_filter().map(pipelines.kill_self_at)
    with DataLoader(pipe, MultiProcessingReadingService(2, timeout=30), seed=0) as loader:
        with pytest.raises(
            WorkerError, match=r"worker process 1 \(pid \d+\) was killed by signal 9 \(SIGKILL\)"
        ):
            list(loader)


def test_a_worker_killed_while_the_merge_waits_for_another_raises_at_once():
    """The merge waits for worker 0's item; worker 1's death must end that wait, not the
    timeout (the pool polls every worker's sentinel after an empty get)."""
    pipe = IterableWrapper(range(4)).sharding_filter().map(pipelines.stall_at_0_and_kill_self_at_1)
    with DataLoader(pipe, MultiProcessingReadingService(2, timeout=10), seed=0) as loader:
        with pytest.raises(WorkerError, match=r"worker process 1 \(pid \d+\) was killed"):
            list(loader)


def test_worker_init_fn_runs_once_per_worker_and_its_errors_name_the_worker():
    pipe = IterableWrapper(range(4)).sharding_filter()
    with DataLoader(
        pipe, MultiProcessingReadingService(2, worker_init_fn=_init_ok), seed=0
    ) as loader:
        assert list(loader) == [0, 1, 2, 3]
    with DataLoader(
        pipe, MultiProcessingReadingService(2, worker_init_fn=_init_fails, timeout=30), seed=0
    ) as loader:
        with pytest.raises(RuntimeError, match=r"(?s)cannot open storage.*in worker_init_fn\(0\)"):
            list(loader)


def _init_ok(worker_id):
    assert pipeloom.get_worker_info().id == worker_id


def _init_fails(worker_id):
    raise RuntimeError("cannot open storage")


def test_unpicklable_pipeline_under_spawn_names_the_block():
    lock = threading.Lock()
    pipe = IterableWrapper(range(4)).sharding_filter().map(lambda x, lock=lock: x)
    with DataLoader(pipe, MultiProcessingReadingService(1, start_method="spawn"), seed=0) as loader:
        with pytest.raises(
            TypeError, match=r"(?s)block Mapper\(fn=.*cannot be pickled.*lock.*module level"
        ):
            list(loader)


def test_timeout_raises_instead_of_waiting_forever():
    pipe = IterableWrapper(range(4)).sharding_filter().map(_wait_forever)
    with DataLoader(pipe, MultiProcessingReadingService(1, timeout=0.5), seed=0) as loader:
        with pytest.raises(TimeoutError, match="timeout=0.5") as raised:
            list(loader)
    # what a stuck worker may be doing, and how to find where it waits
    assert "a worker is stuck (on a network read, a lock" in str(raised.value)
    assert "run the pipeline in the main process (num_workers=0" in str(raised.value)


def _wait_forever(x):
    threading.Event().wait(60)
    return x


def test_break_shutdown_and_gc_leave_no_process_or_shared_memory():
    gc.collect()
    before = OwnResources()  # this process tree's: /dev/shm is shared with other jobs
    for persistent in (False, True):
        loader = DataLoader(
            IterableWrapper(range(10_000)).sharding_filter().map(_big),
            MultiProcessingReadingService(2, persistent_workers=persistent),
            seed=0,
        )
        for i, _ in enumerate(loader):
            if i == 3:
                break
        assert len(list(loader)) == 10_000
        del loader
    assert multiprocessing.active_children() == []
    before.assert_released(timeout=10)


def _big(x):
    import numpy as np

    return np.full(1000, x)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_workers": -1}, "num_workers must be an int >= 0, got -1; use 0"),
        ({"num_workers": 2, "prefetch_factor": 0}, "prefetch_factor must be an int >= 1"),
        ({"num_workers": 2, "start_method": "thread"}, "start_method must be one of"),
        ({"num_workers": 2, "timeout": -1}, "timeout must be a number of seconds > 0"),
    ],
)
def test_bad_arguments_are_explained(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiProcessingReadingService(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"persistent_workers": "no"}, "persistent_workers must be a bool, got str 'no'"),
        ({"in_order": "yes"}, "in_order must be a bool, got str 'yes'"),
        ({"persistent_workers": 1}, "persistent_workers must be a bool, got int 1"),
        ({"worker_init_fn": 3}, "worker_init_fn must be callable or None, got int"),
    ],
)
def test_options_of_the_wrong_type_are_refused(kwargs, message):
    # "no" is truthy: accepted, it would have turned persistent workers on
    with pytest.raises(TypeError, match=message):
        MultiProcessingReadingService(2, **kwargs)


def test_item_rng_draws_continue_across_the_process_merge():
    expected = list(DataLoader(pipelines.draws_on_both_sides_of_the_merge(), seed=4))
    with DataLoader(
        pipelines.draws_on_both_sides_of_the_merge(), MultiProcessingReadingService(2), seed=4
    ) as loader:
        assert list(loader) == expected


def test_persistent_workers_survive_a_tail_that_stops_early():
    def pipe():
        return IterableWrapper(range(50)).sharding_filter().map(abs).header(7)

    service = MultiProcessingReadingService(2, persistent_workers=True, timeout=30)
    with DataLoader(pipe(), service, seed=0) as loader:
        assert list(loader) == list(range(7))
        assert list(loader) == list(range(7))  # no leftovers of the abandoned epoch


def _slow_first(x):
    if x == 0:
        threading.Event().wait(0.5)  # worker 0 owns position 0; worker 1 runs ahead
    return x


def test_the_merge_sleeps_while_a_worker_that_is_ahead_has_unread_items(monkeypatch):
    from pipeloom.reading_service.strategies.classic import process_pool

    calls = [0]
    get_nowait = process_pool._ProcessChannel.get_nowait

    def counting(self):
        calls[0] += 1
        return get_nowait(self)

    monkeypatch.setattr(process_pool._ProcessChannel, "get_nowait", counting)
    pipe = IterableWrapper(range(8)).sharding_filter().map(_slow_first)
    with DataLoader(pipe, MultiProcessingReadingService(2, start_method="fork"), seed=0) as loader:
        assert list(loader) == list(range(8))
    # Worker 1's items sit unread for 0.5 s: a merge that woke on unread data
    # would ask worker 0 thousands of times; one that sleeps asks a few times
    # per item sent.
    assert calls[0] < 60, calls[0]


def test_a_fork_server_is_asked_to_preload_pipeloom():
    from multiprocessing import forkserver

    from pipeloom.reading_service.workers.process import PRELOAD, worker_context

    context = worker_context("forkserver")
    assert context.get_start_method() == "forkserver"
    modules = forkserver._forkserver._preload_modules
    assert PRELOAD in modules and "__main__" in modules  # the default stays
    worker_context("forkserver")
    assert forkserver._forkserver._preload_modules.count(PRELOAD) == 1


@pytest.mark.timeout(60)
def test_cancelling_an_epoch_does_not_wait_for_an_end_already_read():
    # Abandoning an epoch near its end (autotune re-placing at the last batch)
    # waited the whole cancel timeout for an END the merge had already read.
    service = MultiProcessingReadingService(2, persistent_workers=True)
    with DataLoader(IterableWrapper(range(6)).sharding_filter(), service) as loader:
        assert sorted(loader) == list(range(6))  # every worker's END was read
        processes = service._require_runner().pool._processes  # noqa: SLF001
        processes.cancel_epoch(timeout=0.2)  # raised TimeoutError: nothing more was coming
        assert list(loader) == list(range(6))  # the workers serve the next epoch


_COLLATED = multiprocessing.Value("i", 0)


def _count_collated(batch):
    with _COLLATED.get_lock():
        _COLLATED.value += 1
    return batch


@pytest.mark.parametrize("prefetch_factor", [1, 2, 3])
def test_classic_workers_make_at_most_prefetch_factor_batches_ahead_like_torch(prefetch_factor):
    """torch counts the batch a worker is making among its ``prefetch_factor``; so do we.

    With a consumer that holds its first batch, the workers may collate no more
    than ``1 + workers * prefetch_factor`` batches (classic used to make one more
    per worker, so big batches took a batch of memory more per worker than torch).
    """
    import time

    _COLLATED.value = 0
    pipe = IterableWrapper(range(200)).sharding_filter().batch(2).collate(_count_collated)
    service = MultiProcessingReadingService(2, prefetch_factor=prefetch_factor, start_method="fork")
    with DataLoader(pipe, service) as loader:
        batches = iter(loader)
        first = next(batches)
        time.sleep(1.0)  # one settling period (not a poll): let the workers run ahead
        made = _COLLATED.value
        rest = list(batches)
    assert first == [0, 1] and len(rest) == 99  # nothing lost to the waiting
    assert 1 + 2 <= made <= 1 + 2 * prefetch_factor
