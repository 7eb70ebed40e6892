"""Checkpoint mid-epoch and resume in a fresh loader, for every reading service."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.errors import StateError
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)
from tests.reading_service import pipelines
from tests.reading_service.resuming import resume_case


def services():
    return {
        "in-process": lambda: InProcessReadingService(),
        "threads-1": lambda: ThreadReadingService(1),
        "threads-3": lambda: ThreadReadingService(3),
        "processes-2": lambda: MultiProcessingReadingService(2),
    }


BUILDERS = {
    "augmented": pipelines.augmented,  # shuffle before, filter + flatmap in workers, batch in main
    "draws": pipelines.draws_on_both_sides_of_the_merge,
    "batched-in-workers": pipelines.batched_in_workers,
}


@pytest.mark.parametrize("service", sorted(services()))
@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_resume_mid_epoch_equals_the_uninterrupted_epoch(service, builder):
    for stop in (0, 2):
        resume_case(BUILDERS[builder], services()[service], stop)


@settings(max_examples=8, deadline=None)
@given(stop=st.integers(0, 12), threads=st.integers(1, 4))
def test_resume_at_any_step_with_any_thread_count(stop, threads):
    resume_case(pipelines.augmented, lambda: ThreadReadingService(threads), stop)


def test_a_checkpoint_from_threads_resumes_under_processes():
    with DataLoader(pipelines.augmented(), ThreadReadingService(2), seed=1) as loader:
        expected = list(loader)
        iterator = iter(loader)
        loader.set_epoch(0)
        iterator = iter(loader)
        head = [next(iterator) for _ in range(2)]
        state = loader.state_dict()
    with DataLoader(pipelines.augmented(), MultiProcessingReadingService(3), seed=1) as resumed:
        resumed.load_state_dict(state)
        assert head + list(resumed) == expected


def test_an_in_process_state_resumes_under_a_worker_service():
    expected = list(DataLoader(pipelines.augmented(), seed=1))
    with DataLoader(pipelines.augmented(), seed=1) as loader:
        iterator = iter(loader)
        head = [next(iterator)]
        state = loader.state_dict()
    with DataLoader(pipelines.augmented(), ThreadReadingService(2), seed=1) as other:
        other.load_state_dict(state)
        assert head + list(other) == expected


def test_arrival_order_cannot_be_checkpointed():
    with DataLoader(
        pipelines.augmented(), ThreadReadingService(2, in_order=False), seed=1
    ) as loader:
        iterator = iter(loader)
        next(iterator)
        with pytest.raises(StateError, match="in_order=False"):
            loader.state_dict()


def test_state_dict_mid_epoch_with_a_prefetch_after_thread_workers():
    def build():
        return IterableWrapper(range(32)).sharding_filter().map(abs).batch(4).prefetch(2)

    expected = list(DataLoader(build(), seed=0))
    with DataLoader(build(), ThreadReadingService(2), seed=0) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(2)]
        state = loader.state_dict()
        assert head + list(iterator) == expected  # reading on after a checkpoint
    with DataLoader(build(), ThreadReadingService(2), seed=0) as resumed:
        resumed.load_state_dict(state)
        assert head + list(resumed) == expected


def _arrival_order(kind):
    if kind == "threads":
        return ThreadReadingService(3, in_order=False)
    return MultiProcessingReadingService(3, in_order=False)


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_a_state_resumed_by_replay_is_refused_in_arrival_order(kind):
    """Replaying drops the first items to come: in arrival order, not the delivered ones."""

    def build():
        return IterableWrapper(range(37)).sharding_filter()

    with DataLoader(build(), InProcessReadingService(), seed=0) as saved_in_process:
        iterator = iter(saved_in_process)
        head = [next(iterator) for _ in range(23)]
        state = saved_in_process.state_dict()
    with DataLoader(build(), _arrival_order(kind), seed=0) as loader:
        loader.load_state_dict(state)
        for _ in range(2):  # refused again: the state stays loaded, nothing is dropped
            with pytest.raises(StateError, match=r"dropping the 23 items.*in_order=False"):
                iter(loader)
    with DataLoader(build(), MultiProcessingReadingService(3), seed=0) as in_order:
        in_order.load_state_dict(state)
        assert head + list(in_order) == list(range(37))


def test_a_replay_count_is_neither_saved_nor_loaded_in_arrival_order():
    from tests.datapipes.helpers import OldStyleDouble

    def build():
        return OldStyleDouble(IterableWrapper(range(20)).sharding_filter())

    with DataLoader(build(), _arrival_order("threads"), seed=0, resume_by_replay=True) as loader:
        iterator = iter(loader)
        next(iterator)
        with pytest.raises(StateError, match="resume_by_replay=True cannot stand in"):
            loader.state_dict()
    with DataLoader(build(), seed=0, resume_by_replay=True) as in_process:
        iterator = iter(in_process)
        next(iterator)
        state = in_process.state_dict()
    assert state["service"] == {"kind": "replay", "delivered": 1}
    with DataLoader(build(), _arrival_order("threads"), seed=0) as loader:
        with pytest.raises(StateError, match=r"dropping the 1 item .*in_order=False"):
            loader.load_state_dict(state)
