"""Blocks after the sharding point that hold items or draw randomness, resumed on other rank counts.

Each old rank stops at a step, the rest of the epoch is read on the new ranks
(simulated in one process, as in ``test_elastic.py``), and every sample of the
epoch must come out exactly once: ``in_batch_shuffle`` and ``map_batches``
between batches keep no state, the others share what they hold out over the
new ranks (``HoldsItems``). ``groupby`` keeps refusing, and says why.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import IterableWrapper
from pipeloom.errors import StateError
from pipeloom.testing import collect
from tests.reading_service.test_elastic import _elastic, _epoch, _service


def value(x):
    while isinstance(x, (list, tuple)):
        x = x[0]
    return x


def sort_run(run):
    return sorted(run, key=value)


def tokens(x):
    return [x] * (1 + x % 3)


def twice(x):
    return [(x, "a"), (x, "b")]


def square(x):
    return x * x


def _source():
    return IterableWrapper(range(29)).sharding_filter()


PIPELINES = {
    "in_batch_shuffle": lambda: _source().batch(3).in_batch_shuffle(),
    "map_batches": lambda: _source().map_batches(sort_run, 3),
    "prefetch": lambda: _source().prefetch(3),
    "bucketbatch": lambda: _source().bucketbatch(2, batch_num=2, sort_key=sort_run),
    "max_token_bucketize": lambda: _source().map(tokens).max_token_bucketize(6, buffer_size=4),
    "shuffled_flatmap": lambda: _source().shuffled_flatmap(twice, buffer_size=3),
    "threadpool_map": lambda: _source().threadpool_map(square, max_workers=2, scheduled_tasks=4),
}


def _samples(outputs) -> list:
    flat: list = []
    for output in outputs:
        if isinstance(output, list) and output and isinstance(output[0], (list, tuple)):
            flat.extend(tuple(x) for x in output)  # a batch of token lists or pairs
        elif isinstance(output, list):
            flat.extend(output)
        else:
            flat.append(output)
    return sorted(flat, key=repr)


@pytest.mark.timeout(120)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["in-process", "threads"]),
    name=st.sampled_from(sorted(PIPELINES)),
    old=st.integers(1, 3),
    new=st.integers(1, 3),
    step=st.integers(0, 8),
)
def test_every_sample_once_when_resumed_on_another_number_of_ranks(kind, name, old, new, step):
    build = PIPELINES[name]
    full = _samples(_epoch("in-process", build, 1, 0)[0])
    head, tail = _elastic(kind, build, old, new, step)
    assert _samples(head + [x for outputs in tail for x in outputs]) == full


@pytest.mark.parametrize("kind", ["in-process", "threads"])
@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_each_block_resumes_two_ranks_on_three_and_three_on_two(name, kind):
    build = PIPELINES[name]
    full = _samples(_epoch("in-process", build, 1, 0)[0])
    for old, new, step in [(2, 3, 4), (3, 2, 3)]:
        head, tail = _elastic(kind, build, old, new, step)
        assert _samples(head + [x for outputs in tail for x in outputs]) == full, (old, new)


@pytest.mark.parametrize("name", sorted(set(PIPELINES) - {"in_batch_shuffle"}))
def test_a_checkpoint_in_the_rest_holding_other_ranks_items_resumes_on_the_same_ranks(name):
    from pipeloom.reading_service.distributed.elastic import held_states, rest_of_epoch

    build = PIPELINES[name]
    ranks = []
    for rank in range(3):
        inner: list = []
        _, picture = _epoch("in-process", build, 3, rank, stop=4, inner=inner)
        ranks.append({"elastic": picture, "padding": False, "inner": inner[0]})
    state = {"kind": "rest", "rest": rest_of_epoch(ranks), "held": held_states(ranks, 1, 0)}
    service = _service("in-process", build, 1, 0)
    try:
        outputs = service.start_epoch(0, state)
        head = list(itertools.islice(outputs, 1))  # other ranks' items still held
        saved = service.state_dict()
        tail = list(outputs)
    finally:
        service.shutdown()
    assert head + _epoch("in-process", build, 1, 0, saved)[0] == head + tail


def test_in_batch_shuffle_orders_a_batch_by_its_stamp_not_by_the_batches_before_it():
    batches = [list(range(8 * i, 8 * i + 8)) for i in range(6)]
    every = collect(IterableWrapper(batches).in_batch_shuffle(seed=5))
    halves = collect(
        IterableWrapper(batches).filter(lambda b: b[0] % 16 == 0).in_batch_shuffle(seed=5)
    )
    assert halves == every[::2] and every != batches


def test_in_batch_shuffle_and_map_batches_hold_nothing_between_batches():
    shuffled = IterableWrapper(range(8)).batch(4).in_batch_shuffle(seed=1)
    mapped = IterableWrapper(range(8)).map_batches(sort_run, 4)
    for block, outputs in ((shuffled, 1), (mapped, 4)):
        fresh = block.state_dict()
        it = iter(block)
        for _ in range(outputs):
            next(it)
        assert block.state_dict() == fresh, block


def test_groupby_after_the_sharding_point_refuses_and_says_why_and_what_to_do():
    def grouped():
        return _source().groupby(lambda x: x % 3, group_size=2, buffer_size=6)

    with pytest.raises(StateError, match=r"Grouper.*split it.*move it before sharding_filter"):
        _elastic("in-process", grouped, 2, 3, 2)
