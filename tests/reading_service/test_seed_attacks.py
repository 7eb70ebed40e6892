"""Randomness drawn inside user code: the promises pipeloom makes about it.

User functions draw from the global RNGs (``random``, NumPy's legacy global
RNG, torch's default generator) as much as from ``item_rng()``. These tests
attack what docs/reading_services.md promises for them: a process pipeloom
starts seeds them from (seed, epoch), so the draws are the same in every run,
new each epoch and replayed exactly on resume; and a part of the pipeline
that every worker copies must not draw from them, since each copy would draw
its own numbers and keep other items. Fork only; each test stays short.
"""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
import torch

from pipeloom import DataLoader, get_worker_info
from pipeloom.datapipes import IterableWrapper, item_rng, seed_pipeline
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from tests.reading_service.test_separate import InOwnProcess


def global_draws(x):
    """One draw from each global RNG, as torch-style augmentations take them."""
    return (x, random.random(), float(np.random.rand()), float(torch.rand(())))


def side_stream():
    """Batches from worker threads, zipped with a branch that draws in its own process."""
    main = IterableWrapper(range(8)).sharding_filter().batch(2)
    return main.zip(InOwnProcess(IterableWrapper(range(4)).map(global_draws)))


def side_draws(loader, count=None):
    it = iter(loader)
    return [side for _, side in (it if count is None else (next(it) for _ in range(count)))]


@pytest.fixture
def main_rngs_pinned():
    """The main process's global RNGs in one fixed state before every loader (and after)."""
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())

    def pin():
        random.seed(0)
        np.random.seed(0)
        torch.manual_seed(0)

    yield pin
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])


@pytest.mark.timeout(30)
def test_a_separate_process_draws_the_same_each_run_new_each_epoch_and_resumes_exactly(
    main_rngs_pinned,
):
    # Forked from the main process, the branch's process got the main's NumPy and
    # torch states (the same each epoch when the main draws nothing between epochs)
    # and a `random` reseeded from the OS at fork (another one each run).
    service = lambda: ThreadReadingService(2)  # noqa: E731  (its separate process forks)
    main_rngs_pinned()
    with DataLoader(side_stream(), service(), seed=3) as loader:
        first, second = side_draws(loader), side_draws(loader)
    main_rngs_pinned()
    with DataLoader(side_stream(), service(), seed=3) as loader:
        again = side_draws(loader)
    assert again == first  # the same seed: the same draws in every run
    # each epoch draws anew, from every global RNG
    assert all(x != y for a, b in zip(first, second) for x, y in zip(a[1:], b[1:]))

    main_rngs_pinned()
    with DataLoader(side_stream(), service(), seed=3) as loader:
        before = side_draws(loader, 2)
        state = loader.state_dict()
    random.seed(1)  # another main process state: the resumed process must not care
    with DataLoader(side_stream(), service(), seed=3) as resumed:
        resumed.load_state_dict(state)
        assert before + side_draws(resumed) == first


# -- the copied part before the sharding point ------------------------------------------


def coin(x):
    """A random subsample before the sharding point, drawn from the global RNG."""
    return random.random() < 0.5


def item_coin(x):
    """The same subsample from item_rng(): equal in every copy."""
    return item_rng().random() < 0.5


def subsampled(keep, shard=None):
    """``range(40)`` filtered by ``keep`` before the sharding point, then batched.

    With ``shard``, seeded and set as a worker's (or rank's) copy is.
    """
    sharded = IterableWrapper(range(40)).filter(keep).sharding_filter()
    pipe = sharded.map(lambda x: x * 10).batch(4)
    if shard is not None:
        seed_pipeline(pipe, 1)
        sharded.sharding_settings(*shard)
    return pipe


def test_a_copy_before_the_sharding_point_that_draws_globally_is_warned_about(main_rngs_pinned):
    # What the workers' copies do: each draws its own coins (worker processes are
    # seeded apart), so the shards, together, read some items twice and others
    # never, and nothing said so.
    items = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for index in range(2):
            random.seed(index)
            items += sum(list(subsampled(coin, (2, index))), [])
    assert len(set(items)) < len(items)
    with pytest.warns(RuntimeWarning, match="some read twice, others never"):
        list(subsampled(coin, (2, 0)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(subsampled(coin, (1, 0)))  # one shard: nothing is copied, nothing to warn about
        list(subsampled(item_coin, (2, 0)))  # item_rng() draws the same in every copy


@pytest.mark.timeout(30)
def test_worker_processes_warn_about_global_draws_before_the_sharding_point():
    # The warning is raised in the worker (pytest turns warnings into errors, and a
    # forked worker inherits that), so it comes back as the worker's error, with
    # the worker, block and item named.
    service = MultiProcessingReadingService(2, start_method="fork", timeout=20)
    with DataLoader(subsampled(coin), service, seed=1) as loader:
        with pytest.raises(RuntimeWarning, match="(?s)before a sharding point.*worker process"):
            list(loader)


@pytest.mark.timeout(30)
def test_worker_threads_warn_about_global_draws():
    def build():
        return IterableWrapper(range(8)).sharding_filter().map(global_draws).batch(2)

    with DataLoader(build(), ThreadReadingService(2), seed=1) as loader:
        with pytest.raises(RuntimeWarning, match="(?s)share one interpreter's global RNGs.*thread"):
            list(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipe = IterableWrapper(range(8)).sharding_filter().map(item_coin).batch(2)
        with DataLoader(pipe, ThreadReadingService(2), seed=1) as loader:
            assert sum(len(batch) for batch in loader) == 8  # item_rng(): nothing to say


# -- ranks ----------------------------------------------------------------------------


def worker_seed_of(x):
    return get_worker_info().seed


def one_rank(rank, service, fn):
    """What rank ``rank`` of 2 reads (every rank agrees on the pipeline seed)."""
    service.set_outer_sharding(2, rank)
    pipe = IterableWrapper(range(8)).sharding_filter().map(fn).batch(2)
    with DataLoader(pipe, service, seed=0) as loader:
        return [out for batch in loader for out in batch]


@pytest.mark.timeout(30)
def test_worker_i_of_each_rank_draws_its_own_numbers():
    # Worker seeds derived from (seed, epoch, worker id) alone: worker 0 of rank 1
    # drew rank 0's worker 0's numbers, so every rank had the same augmentations.
    draws = [
        {out[1:] for out in one_rank(rank, MultiProcessingReadingService(2), global_draws)}
        for rank in range(2)
    ]
    assert len(draws[0]) == len(draws[1]) == 4 and not draws[0] & draws[1]
    seeds = [set(one_rank(rank, ThreadReadingService(2), worker_seed_of)) for rank in range(2)]
    assert len(seeds[0]) == len(seeds[1]) == 2 and not seeds[0] & seeds[1]


@pytest.mark.timeout(60)
def test_persistent_workers_that_are_not_reseeded_run_their_streams_on_across_epochs():
    def loader(size):
        pipe = IterableWrapper(range(size)).sharding_filter().map(global_draws)
        service = MultiProcessingReadingService(
            1, start_method="fork", persistent_workers=True, reseed_global_rngs=False
        )
        return DataLoader(pipe, service, seed=0)

    with loader(4) as short, loader(8) as long:
        two_epochs = list(short) + list(short)  # the second epoch goes on from the first
        assert [d[1:] for d in two_epochs] == [d[1:] for d in list(long)]


def test_not_reseeding_the_global_rngs_is_refused_where_items_are_seeded_one_by_one():
    with pytest.raises(ValueError, match="reseed_global_rngs=False only applies to strategy='c"):
        MultiProcessingReadingService(2, strategy="economic", reseed_global_rngs=False)
