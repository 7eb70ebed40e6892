"""The strongest promise: output depends only on pipeline, seed and epoch.

Random pipelines x worker counts x reading services give the in-process items
in the in-process order; a checkpoint at a random step resumes exactly.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from tests.reading_service.random_pipelines import batched, build, recipes

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
