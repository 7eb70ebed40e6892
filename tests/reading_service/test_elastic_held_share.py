"""Items held after the sharding point, shared out over the new ranks of an elastic resume.

The old ranks' held items (``threadpool_map``'s items in flight, a ``prefetch``
buffer, ``map_batches``' results, a ``shuffle`` buffer) went whole to one new
rank (old rank ``r`` to new rank ``r % new``); ``uneven="shortest"`` stops the
new ranks together at the shortest, so when another new rank had nothing else
left, they were all dropped: ``IterableWrapper(range(31)).sharding_filter()
.threadpool_map(plus)``, one rank stopped after 2 items, resumed on 2 ranks,
both yielded ``[]`` (29 of 31 items lost; the resume fuzzer's seed 310350).
Every new rank now keeps its share (``HeldShare``), so "shortest" drops at
most what a fresh run does: one item per new rank here.
"""

from __future__ import annotations

import collections

import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, ThreadPoolMapper
from pipeloom.datapipes.runtime import HeldShare
from pipeloom.errors import StateError
from pipeloom.reading_service import ThreadReadingService, merge_rank_states
from tests.reading_service.thread_ranks import ok, rank_service, run_ranks

SIZE = 31


def plus(x):
    return x + 1000


def plus_each(batch):
    return [x + 1000 for x in batch]


def _source():
    return IterableWrapper(range(SIZE)).sharding_filter()


HOLDING = {  # each holds every item of a rank's shard a step or two into the epoch
    "threadpool_map": lambda: _source().threadpool_map(plus),
    "prefetch": lambda: _source().prefetch(64).map(plus),
    "map_batches": lambda: _source().map_batches(plus_each, 16),
    "shuffle": lambda: _source().shuffle(buffer_size=64).map(plus),
}
EVERY = [x + 1000 for x in range(SIZE)]


def _stop(build, old, uneven, step=2):
    """Each of ``old`` ranks delivers ``step`` items and saves; (their items, the job state)."""

    def stop(world, rank):
        with DataLoader(build(), rank_service(world, rank, uneven), seed=0) as loader:
            epoch = iter(loader)
            return [next(epoch) for _ in range(step)], loader.state_dict()

    stopped = ok(run_ranks(old, stop))
    return [x for head, _ in stopped for x in head], merge_rank_states([s for _, s in stopped])


def _resume(build, new, uneven, joined):
    def resume(world, rank):
        with DataLoader(build(), rank_service(world, rank, uneven), seed=0) as loader:
            loader.load_state_dict(joined)
            return list(loader)

    return ok(run_ranks(new, resume))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(HOLDING))
@pytest.mark.parametrize(("old", "new"), [(1, 2), (1, 3), (2, 3), (3, 2)])
def test_shortest_drops_at_most_an_item_per_new_rank_of_what_blocks_held(name, old, new):
    head, joined = _stop(HOLDING[name], old, "shortest")
    rests = _resume(HOLDING[name], new, "shortest", joined)
    got = collections.Counter(head + [x for rest in rests for x in rest])
    assert not got - collections.Counter(EVERY), "an item twice"
    dropped = sorted(set(EVERY) - set(got))
    assert len(dropped) <= new - 1, (dropped, [len(rest) for rest in rests])
    assert all(rests), "a new rank with no items stops the others at once"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(HOLDING))
def test_pad_delivers_every_held_item_and_the_share_does_not_depend_on_timing(name):
    head, joined = _stop(HOLDING[name], 1, "pad")
    first = _resume(HOLDING[name], 3, "pad", joined)
    assert set(head) | {x for rest in first for x in rest} == set(EVERY)
    assert _resume(HOLDING[name], 3, "pad", joined) == first  # the same job state, again


class OneRankMapper(ThreadPoolMapper):
    """A custom block written before shares: it takes every old rank's items."""

    def load_held_states(self, states):
        super().load_held_states(states)


def _legacy():
    return OneRankMapper(_source(), plus)


@pytest.mark.timeout(60)
def test_a_block_that_takes_no_share_refuses_under_shortest_and_goes_to_one_rank_under_pad():
    _, joined = _stop(_legacy, 1, "shortest")
    for result in run_ranks(2, lambda world, rank: _resume_one(world, rank, joined)):
        assert result[:2] == ("error", "StateError"), result
        assert "OneRankMapper" in result[2] and "takes no share" in result[2], result[2]
        assert "as many ranks" in result[2] and "uneven='pad'" in result[2], result[2]
    head, joined = _stop(_legacy, 1, "pad")
    rests = _resume(_legacy, 2, "pad", joined)
    assert set(head) | {x for rest in rests for x in rest} == set(EVERY)


def _resume_one(world, rank, joined):
    with DataLoader(_legacy(), rank_service(world, rank, "shortest"), seed=0) as loader:
        loader.load_state_dict(joined)
        return list(loader)


@pytest.mark.parametrize("total", [1, 2, 3, 4])
def test_held_shares_are_disjoint_and_together_every_unit_across_several_takes(total):
    blocks = [list(range(5)), [], list(range(100, 107)), [200]]
    shares = [HeldShare(index, total) for index in range(total)]
    taken = [[share.take(units) for units in blocks] for share in shares]
    for b, units in enumerate(blocks):
        assert sorted(x for mine in taken for x in mine[b]) == units
    counts = [sum(map(len, mine)) for mine in taken]
    assert max(counts) - min(counts) <= 1, counts
    assert counts == sorted(counts)  # the last ranks first (the first take the rest's extra)
    with pytest.raises(ValueError, match="index in 0"):
        HeldShare(total, total)


def test_a_held_state_in_another_shape_is_refused_not_ignored():
    from pipeloom.datapipes.runtime import load_held

    pipe = IterableWrapper(range(3)).prefetch(2)
    with pytest.raises(StateError, match="held_states"):
        load_held(pipe, {0: [{"items": [], "ended": False}]})


@pytest.mark.timeout(60)
def test_held_items_of_a_block_the_new_ranks_run_in_workers_refuse_naming_it_and_why():
    # old ranks in their own thread held threadpool_map's items; the new ranks run it in
    # worker threads, where no held items go: the refusal blamed a changed pipeline
    _, joined = _stop(HOLDING["threadpool_map"], 1, "shortest")

    def resume(world, rank):
        service = rank_service(world, rank, "shortest", inner=lambda: ThreadReadingService(1))
        with DataLoader(HOLDING["threadpool_map"](), service, seed=0) as loader:
            loader.load_state_dict(joined)
            return list(loader)

    result = run_ranks(2, resume)[0]
    assert result[:2] == ("error", "StateError"), result
    assert "the items ThreadPoolMapper held" in result[2], result[2]
    assert "in workers" in result[2] and "inner reading service" in result[2], result[2]
