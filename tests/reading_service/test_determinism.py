"""The strongest promise: output depends only on pipeline, seed and epoch.

Random pipelines x worker counts x reading services give the in-process items
in the in-process order; a checkpoint at a random step resumes exactly.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from tests.reading_service.random_pipelines import (
    batched,
    build,
    build_rich,
    recipes,
    rich_batched,
    rich_recipes,
)

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference(recipe, seed, epoch=0):
    loader = DataLoader(build(recipe), seed=seed)
    loader.set_epoch(epoch)
    return list(loader)


@SETTINGS
@given(recipe=recipes, threads=st.integers(0, 4), seed=st.integers(0, 2**20))
def test_threads_give_the_in_process_output_for_random_pipelines(recipe, threads, seed):
    with DataLoader(build(recipe), ThreadReadingService(threads), seed=seed) as loader:
        assert list(loader) == reference(recipe, seed)
        assert list(loader) == reference(recipe, seed, epoch=1)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=recipes, workers=st.integers(0, 3), seed=st.integers(0, 2**20))
def test_processes_give_the_in_process_output_for_random_pipelines(recipe, workers, seed):
    service = MultiProcessingReadingService(workers, persistent_workers=True)
    with DataLoader(build(recipe), service, seed=seed) as loader:
        assert list(loader) == reference(recipe, seed)
        assert list(loader) == reference(recipe, seed, epoch=1)


@SETTINGS
@given(recipe=recipes, threads=st.integers(0, 3), stop=st.integers(0, 40), seed=st.integers(0, 99))
def test_resume_from_a_random_step_of_a_random_pipeline(recipe, threads, stop, seed):
    expected = reference(recipe, seed)
    stop = min(stop, len(expected))
    with DataLoader(build(recipe), ThreadReadingService(threads), seed=seed) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(stop)]
        state = loader.state_dict()
    with DataLoader(build(recipe), ThreadReadingService(threads), seed=seed) as resumed:
        resumed.load_state_dict(state)
        assert head + list(resumed) == expected


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    recipe=recipes,
    strategy=st.sampled_from(["economic", "chunked"]),
    workers=st.integers(1, 3),
    stop=st.integers(0, 10),
    seed=st.integers(0, 99),
)
def test_economic_and_chunked_give_and_resume_the_in_process_output(
    recipe, strategy, workers, stop, seed
):
    recipe = batched(recipe, one_to_one=strategy == "economic")
    expected = reference(recipe, seed)

    def service():
        return MultiProcessingReadingService(workers, strategy=strategy, persistent_workers=True)

    with DataLoader(build(recipe), service(), seed=seed) as loader:
        assert list(loader) == expected
        iterator = iter(loader)
        loader_epoch = loader.epoch
        head = [next(iterator) for _ in range(min(stop, len(expected)))]
        state = loader.state_dict()
    assert loader_epoch == 1
    with DataLoader(build(recipe), service(), seed=seed) as resumed:
        resumed.load_state_dict(state)
        assert head + list(resumed) == reference(recipe, seed, epoch=1)


# -- rich random pipelines: tar shards, webdataset, flatmap/unbatch, custom blocks --------

SERVICE_KINDS = ("in-process", "threads", "classic", "economic", "chunked")


def make_service(kind, workers):
    if kind == "in-process":
        return None
    if kind == "threads":
        return ThreadReadingService(workers)
    return MultiProcessingReadingService(
        workers, strategy=kind, persistent_workers=True, timeout=60
    )


def rich_reference(recipe, seed):
    with DataLoader(build_rich(recipe), seed=seed) as loader:
        return list(loader), list(loader)


def rich_recipe_for(recipe, kind):
    return rich_batched(recipe) if kind in ("economic", "chunked") else recipe


def refused(recipe, kind, workers):
    """True when ``kind`` refuses the pipeline at planning, with a clear ValueError."""
    try:
        with DataLoader(build_rich(recipe), make_service(kind, workers)) as loader:
            loader.placement()
    except ValueError as error:  # PlanError: e.g. economic and a multi-output block
        assert "strategy" in str(error) or "sharding" in str(error), error
        return True
    return False


RICH_PROFILE = settings(  # about 30 s on a quiet 2-core machine; the slow ones run more
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
RICH_PROFILE_SLOW = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _same_items_and_draws(recipe, kind, workers, seed):
    recipe = rich_recipe_for(recipe, kind)
    if refused(recipe, kind, workers):
        return
    with DataLoader(build_rich(recipe), make_service(kind, workers), seed=seed) as loader:
        assert (list(loader), list(loader)) == rich_reference(recipe, seed), (kind, workers)


def _resumes_under_another_service(recipe, saved, resumed, stop, seed):
    (saved_kind, saved_workers), (resumed_kind, resumed_workers) = saved, resumed
    batched = saved_kind in ("economic", "chunked") or resumed_kind in ("economic", "chunked")
    if batched:
        recipe = rich_batched(recipe)
    if refused(recipe, saved_kind, saved_workers) or refused(recipe, resumed_kind, resumed_workers):
        return
    first, second = rich_reference(recipe, seed)
    stop = min(stop, len(first))
    service = make_service(saved_kind, saved_workers)
    with DataLoader(build_rich(recipe), service, seed=seed) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(stop)]
        state = loader.state_dict()
    service = make_service(resumed_kind, resumed_workers)
    with DataLoader(build_rich(recipe), service, seed=seed) as other:
        other.load_state_dict(state)
        assert head + list(other) == first, (saved, resumed, stop)
        assert list(other) == second


services = st.tuples(st.sampled_from(SERVICE_KINDS), st.integers(1, 3))


@pytest.mark.timeout(300)
@RICH_PROFILE
@given(recipe=rich_recipes, service=services, seed=st.integers(0, 99))
def test_rich_random_pipelines_give_the_in_process_items_and_draws(recipe, service, seed):
    # (i) of #13's first promise: items and item_rng() draws equal the in-process run.
    _same_items_and_draws(recipe, *service, seed)


@pytest.mark.timeout(300)
@RICH_PROFILE
@given(
    recipe=rich_recipes,
    saved=services,
    resumed=services,
    stop=st.integers(0, 30),
    seed=st.integers(0, 99),
)
def test_rich_random_pipelines_resume_under_another_service(recipe, saved, resumed, stop, seed):
    # (ii): a checkpoint at a random step resumes in a fresh loader under another
    # service and worker count, giving exactly the rest of the epoch and the next one.
    _resumes_under_another_service(recipe, saved, resumed, stop, seed)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@RICH_PROFILE_SLOW
@given(recipe=rich_recipes, service=services, seed=st.integers(0, 2**20))
def test_rich_random_pipelines_give_the_in_process_output_many(recipe, service, seed):
    _same_items_and_draws(recipe, *service, seed)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@RICH_PROFILE_SLOW
@given(
    recipe=rich_recipes,
    saved=services,
    resumed=services,
    stop=st.integers(0, 30),
    seed=st.integers(0, 2**20),
)
def test_rich_random_pipelines_resume_under_another_service_many(
    recipe, saved, resumed, stop, seed
):
    _resumes_under_another_service(recipe, saved, resumed, stop, seed)
