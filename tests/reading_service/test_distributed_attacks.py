"""Attacks on the ranks of a job: uneven shards, every checkpoint step, other rank counts.

The ranks are threads of this process (``thread_ranks.py``): the service's
own code with in-process collectives, so every rank count from 1 to 4 and
every step of an epoch is cheap to try. A sample seen twice or never, ranks
out of step, or a rank left waiting is what these look for.
"""

from __future__ import annotations

import itertools
import pickle
import re
from collections import Counter

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import ThreadReadingService, merge_rank_states
from tests.reading_service.test_elastic import packed_after_the_point
from tests.reading_service.thread_ranks import ok, rank_service, run_ranks

INNER = {"alone": None, "threads": lambda: ThreadReadingService(2)}


def plain(n: int):
    return IterableWrapper(range(n)).shuffle().sharding_filter().map(lambda x: x)


def batched(n: int):  # one-to-one after the point: the workers batch runs of 2 positions
    return plain(n).batch(2)


PIPELINES = {"plain": plain, "batched": batched}


def _samples(outputs: list) -> list:
    return [x for output in outputs for x in (output if isinstance(output, list) else [output])]


# -- one epoch over uneven shards ---------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(0, 11),
    ranks=st.integers(1, 4),
    inner=st.sampled_from(sorted(INNER)),
    pipeline=st.sampled_from(sorted(PIPELINES)),
    uneven=st.sampled_from(["shortest", "pad"]),
    end_check=st.sampled_from(["length", "step"]),
)
def test_uneven_shards_keep_the_ranks_in_step_and_each_sample_once(
    n, ranks, inner, pipeline, uneven, end_check
):
    def rank(world, index):
        service = rank_service(world, index, uneven, end_check=end_check, inner=INNER[inner])
        with DataLoader(PIPELINES[pipeline](n), service) as loader:  # local seeds differ
            return loader.seed, [list(loader) for _ in range(2)]

    results = run_ranks(ranks, rank)
    if uneven == "pad" and any(r[0] == "error" for r in results):  # documented: all raise
        assert all(r[1] == "ValueError" and "empty shard" in r[2] for r in results), results
        return
    results = ok(results)
    assert len({seed for seed, _ in results}) == 1
    for epoch in range(2):
        shards = [epochs[epoch] for _, epochs in results]
        assert len({len(shard) for shard in shards}) == 1, shards  # in step
        got = Counter(x for shard in shards for x in _samples(shard))
        if uneven == "shortest":  # each at most once, at most a group per rank dropped
            assert max(got.values(), default=1) == 1 and len(got) >= n - 2 * ranks
        else:
            assert set(got) == set(range(n))


# -- a checkpoint at any step, resumed on any number of ranks -------------------------------


def _save(old: int, build, uneven: str, inner: str, step: int) -> tuple[list, dict]:
    """Every old rank's first ``step`` outputs, and the job's state joined after them."""

    def rank(world, index):
        service = rank_service(world, index, uneven, inner=INNER[inner])
        with DataLoader(build(), service, seed=3) as loader:
            head = list(itertools.islice(iter(loader), step))
            mine = pickle.loads(pickle.dumps(loader.state_dict()))
            return head, merge_rank_states(world.exchange(index, mine))

    results = ok(run_ranks(old, rank))
    return [x for head, _ in results for x in _samples(head)], results[0][1]


def _resume(new: int, build, uneven: str, inner: str, state: dict) -> list:
    """Each new rank's (rest of the epoch, the epoch after, a fresh run's epochs 1 and 2)."""

    def rank(world, index):
        service = rank_service(world, index, uneven, inner=INNER[inner])
        with DataLoader(build(), service, seed=99) as loader:
            loader.load_state_dict(state)
            rest, following = list(loader), list(loader)
        fresh = rank_service(world, index, uneven, inner=INNER[inner])
        with DataLoader(build(), fresh, seed=3) as loader:
            loader.set_epoch(1)
            return rest, following, list(loader), list(loader)

    return ok(run_ranks(new, rank))


def _check_elastic(old, new, pipeline, n, uneven, inner, step) -> None:
    build = lambda: PIPELINES[pipeline](n)  # noqa: E731
    head, state = _save(old, build, uneven, inner, step)
    resumed = _resume(new, build, uneven, inner, state)
    rests = [rest for rest, *_ in resumed]
    assert len({len(rest) for rest in rests}) == 1, rests  # the new ranks in step
    if state["service"] is None:  # saved between epochs: the next one is a fresh run's
        assert all(r[:2] == r[2:] for r in resumed)
        return
    got = Counter(head + [x for rest in rests for x in _samples(rest)])
    if uneven == "shortest":  # at most what a fresh uneven run drops
        assert max(got.values(), default=1) == 1 and len(got) >= n - 2 * new
    else:
        assert set(got) == set(range(n))
    assert all(following == fresh for _, following, fresh, _ in resumed)


@settings(max_examples=25, deadline=None)
@given(
    old=st.integers(1, 4),
    new=st.integers(1, 4),
    pipeline=st.sampled_from(sorted(PIPELINES)),
    n=st.integers(5, 10),
    uneven=st.sampled_from(["shortest", "pad"]),
    inner=st.sampled_from(sorted(INNER)),
    data=st.data(),
)
def test_every_sample_once_from_any_step_on_any_number_of_ranks(
    old, new, pipeline, n, uneven, inner, data
):
    groups = n if pipeline == "plain" else (n + 1) // 2
    assume(uneven == "shortest" or groups >= max(old, new))  # pad: no empty shard (a ValueError)
    step = data.draw(st.integers(0, n // old + 1), label="step")
    _check_elastic(old, new, pipeline, n, uneven, inner, step)


@pytest.mark.parametrize("inner", sorted(INNER))
def test_a_job_checkpointed_between_epochs_resumes_on_another_number_of_ranks(inner):
    # 2 ranks x 5 items: the 6th next() ends the epoch; the joined state starts epoch 1
    _check_elastic(2, 3, "plain", 10, "shortest", inner, 6)


@pytest.mark.parametrize(("old", "new"), [(1, 3), (3, 1)])
def test_one_rank_without_workers_resumes_on_more_ranks_and_more_on_one(old, new):
    for step in (0, 2):
        _check_elastic(old, new, "batched", 9, "shortest", "alone", step)


@pytest.mark.parametrize("inner", sorted(INNER))
def test_a_rank_repeating_its_shard_under_pad_resumes_on_another_number_of_ranks(inner):
    # 3 ranks, 7 items: rank 0 has 3, the others 2 and repeat their first item at step 3
    _check_elastic(3, 2, "plain", 7, "pad", inner, 3)


def test_a_resumed_job_that_checkpoints_before_its_first_step_resumes_again():
    head, state = _save(2, lambda: plain(20), "shortest", "alone", 3)

    def checkpoint_at_once(world, index):
        service = rank_service(world, index)
        with DataLoader(plain(20), service, seed=3) as loader:
            loader.load_state_dict(state)
            return merge_rank_states(world.exchange(index, loader.state_dict()))

    again = ok(run_ranks(3, checkpoint_at_once))[0]
    rests = [rest for rest, *_ in _resume(2, lambda: plain(20), "shortest", "alone", again)]
    assert sorted(head + [x for rest in rests for x in rest]) == list(range(20))


def test_a_checkpoint_in_the_rest_while_a_block_drains_several_ranks_buffers_resumes():
    # 2 ranks' shuffle buffers (up to 5 items each) go to the one new rank's shuffle(5)
    _, state = _save(2, packed_after_the_point, "shortest", "threads", 1)

    def checkpoint_in_the_rest(world, index):
        service = rank_service(world, index, inner=INNER["threads"])
        with DataLoader(packed_after_the_point(), service) as loader:
            loader.load_state_dict(state)
            outputs = iter(loader)
            head = list(itertools.islice(outputs, 1))
            again = pickle.loads(pickle.dumps(loader.state_dict()))
            rest = list(outputs)
        service = rank_service(world, index, inner=INNER["threads"])
        with DataLoader(packed_after_the_point(), service) as loader:
            loader.load_state_dict(again)
            return head, rest, list(loader)

    ((head, rest, resumed),) = ok(run_ranks(1, checkpoint_in_the_rest))
    assert head and rest and resumed == rest


# -- failures name the rank; nothing waits forever ------------------------------------------


def test_a_rank_raising_mid_epoch_is_named_by_the_others():
    def fails_at_seven(x):
        if x == 7:
            raise KeyError("bad sample 7")
        return x

    def rank(world, index):
        pipe = IterableWrapper(range(20)).sharding_filter().map(fails_at_seven)
        with DataLoader(pipe, rank_service(world, index, end_check="step")) as loader:
            return list(loader)

    results = run_ranks(3, rank)  # 7 is rank 1's
    assert results[1][:2] == ("error", "KeyError")
    for index in (0, 2):
        assert results[index][:2] == ("error", "DistributedError")
        assert (
            f"rank 1 raised an error while loading its shard, so rank {index}"
            in (results[index][2])
        )


def test_a_new_rank_with_nothing_to_pad_with_says_so_and_stops_the_others_at_once():
    # 3 batches of 2: after one step on 2 ranks, 1 is left for 4 new ranks, and rank 3's
    # shard of a whole epoch on 4 ranks is empty too: under pad it has nothing to repeat
    build = lambda: batched(5)  # noqa: E731
    _, state = _save(2, build, "pad", "alone", 1)

    def rank(world, index):
        with DataLoader(build(), rank_service(world, index, "pad")) as loader:
            loader.load_state_dict(state)
            return list(loader)

    results = run_ranks(4, rank, timeout=30)  # told at the next step, not after the timeout
    assert results[3][:2] == ("error", "ValueError")
    assert "rank 3 has no items of the rest of this epoch (resumed on 4 ranks)" in results[3][2]
    for index in range(3):
        assert results[index][:2] == ("error", "DistributedError")
        assert (
            f"rank 3 raised an error while loading its shard, so rank {index}"
            in (results[index][2])
        )


def test_ranks_resuming_from_different_steps_all_refuse_with_the_steps():
    def save(world, index):
        with DataLoader(plain(20), rank_service(world, index), seed=3) as loader:
            list(itertools.islice(iter(loader), 2 + index))
            return loader.state_dict()

    states = ok(run_ranks(2, save))

    def load(world, index):
        with DataLoader(plain(20), rank_service(world, index), seed=3) as loader:
            loader.load_state_dict(states[index])
            return list(loader)

    for result in run_ranks(2, load):
        assert result[:2] == ("error", "ValueError")
        assert "resume from different steps (2, 3 items delivered, by rank)" in result[2]


def test_a_rank_state_loaded_on_another_number_of_ranks_points_to_merge_rank_states():
    def save(world, index):
        with DataLoader(plain(20), rank_service(world, index), seed=3) as loader:
            list(itertools.islice(iter(loader), 2))
            return loader.state_dict()

    states = ok(run_ranks(2, save))

    def load(world, index):
        with DataLoader(plain(20), rank_service(world, index), seed=3) as loader:
            loader.load_state_dict(states[index % 2])
            return list(loader)

    for result in run_ranks(3, load):
        assert result[:2] == ("error", "StateError")
        assert re.search(
            r"this state is rank \d of 2's, but this process is rank \d of 3", result[2]
        )
        assert "join them with merge_rank_states() and load the result" in result[2]
