"""Resuming an epoch on another number of ranks, simulated in one process.

Each old rank is an in-process or thread service keeping outer shard ``r`` of
``R`` (what ``DistributedReadingService`` sets on each rank); the job state
is the ranks' pictures (``distributed/elastic.py``), and the new ranks read
the rest of the epoch from it. Real multi-rank runs are in
``test_elastic_ranks.py``.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, SequenceWrapper, seed_pipeline
from pipeloom.datapipes.runtime import RestOfEpoch
from pipeloom.errors import StateError
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
    merge_rank_states,
)
from pipeloom.reading_service.distributed.elastic import held_states, rank_picture, rest_of_epoch
from tests.reading_service.thread_ranks import ok, rank_service, run_ranks


def plain():
    return IterableWrapper(range(37)).shuffle().sharding_filter().map(lambda x: (x,))


def batched():  # one-to-one after the sharding point: threads batch runs of 3 positions
    return IterableWrapper(range(37)).sharding_filter().map(lambda x: x).batch(3)


def expanded():  # three outputs per position: a checkpoint can fall inside a position
    return IterableWrapper(range(13)).sharding_filter().flatmap(lambda x: [(x, j) for j in "abc"])


def mixed_and_packed():  # mix and pack before the sharding point, read in the shards
    web = IterableWrapper([[i] * 4 for i in range(32)])
    code = IterableWrapper([[100 + i] * 4 for i in range(16)])
    rows = web.mux(code, weights=[2, 1], stop="all").pack(8)
    return rows.sharding_filter().map(lambda row: tuple(row[0].tolist()))


def tokens(batch):  # a batch of packed rows -> the documents' tokens in it (0 pads)
    return [int(t) for values, _, _ in batch for t in values.tolist() if t]


def packed_after_the_point():  # the language-model shape: shuffle, pack, bucket in the shards
    docs = IterableWrapper([[i + 1] * (i % 5 + 1) for i in range(40)])
    rows = docs.sharding_filter().shuffle(buffer_size=5).pack(8, buffer_size=3)
    rows = rows.bucket_by_length(
        lambda row: int((row[0] != 0).sum()), boundaries=[6], batch_sizes=2
    )
    return rows.map(tokens)


PIPELINES = {
    "plain": plain,
    "batched": batched,
    "expanded": expanded,
    "mixed+packed": mixed_and_packed,
    "packed after the point": packed_after_the_point,
}


def _samples(outputs: list) -> list:
    flat = []
    for output in outputs:
        flat.extend(output if isinstance(output, list) else [output])
    return flat


def _service(kind: str, build, total: int, index: int):
    service = InProcessReadingService() if kind == "in-process" else ThreadReadingService(2)
    service.set_outer_sharding(total, index)
    pipeline = build()
    seed_pipeline(pipeline, 11)
    service.initialize(pipeline)
    return service


def _epoch(kind, build, total, index, state=None, stop=None, inner=None):
    service = _service(kind, build, total, index)
    try:
        outputs = list(itertools.islice(service.start_epoch(0, state), stop))
        picture = rank_picture(service, 0) if stop is not None else None
        if inner is not None:
            inner.append(service.state_dict())
        return outputs, picture
    finally:
        service.shutdown()


def _elastic(kind, build, old, new, step, *, with_held=True):
    head, ranks = [], []
    for rank in range(old):
        inner: list = []
        outputs, picture = _epoch(kind, build, old, rank, stop=step, inner=inner)
        head += outputs
        ranks.append({"elastic": picture, "padding": False, "inner": inner[0]})
    rest = rest_of_epoch(ranks)
    tail = []
    for rank in range(new):
        held = held_states(ranks, new, rank) if with_held else {}
        state = {"kind": "rest", "rest": rest, "held": held}
        tail.append(_epoch(kind, build, new, rank, state)[0])
    return head, tail


@pytest.mark.timeout(120)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["in-process", "threads"]),
    name=st.sampled_from(sorted(PIPELINES)),
    old=st.integers(2, 4),
    new=st.integers(2, 4),
    step=st.integers(0, 14),
)
def test_every_sample_of_the_epoch_once_across_the_new_ranks(kind, name, old, new, step):
    build = PIPELINES[name]
    full = _samples(_epoch("in-process", build, 1, 0)[0])
    try:
        head, tail = _elastic(kind, build, old, new, step)
    except StateError as error:  # in-process, a checkpoint inside a position's outputs
        assert kind == "in-process" and name == "expanded"
        assert "FlatMapper" in str(error) and "sharding_filter()" in str(error)
        return
    got = _samples(head) + [x for outputs in tail for x in _samples(outputs)]
    assert sorted(got) == sorted(full)


def test_the_rest_is_dealt_out_evenly_over_the_new_ranks():
    head, tail = _elastic("in-process", plain, 2, 3, 5)
    assert len(head) == 10 and [len(outputs) for outputs in tail] == [9, 9, 9]


def test_a_block_not_at_rest_that_declares_no_held_items_refuses_and_says_what_to_do():
    def numbered_in_the_shards():
        return IterableWrapper(range(40)).sharding_filter().enumerate()

    with pytest.raises(StateError, match=r"Enumerator.*HoldsItems.*move it before sharding_filter"):
        _elastic("in-process", numbered_in_the_shards, 2, 3, 2)


@pytest.mark.parametrize("kind", ["in-process", "threads"])
def test_held_items_are_shared_out_over_the_new_ranks_and_ignoring_them_loses_samples(kind):
    full = sorted(_samples(_epoch("in-process", packed_after_the_point, 1, 0)[0]))
    for old, new, step in [(2, 3, 2), (3, 2, 1), (4, 2, 2)]:
        head, tail = _elastic(kind, packed_after_the_point, old, new, step)
        assert sorted(_samples(head) + [t for out in tail for t in _samples(out)]) == full
        head, tail = _elastic(kind, packed_after_the_point, old, new, step, with_held=False)
        lost = sorted(_samples(head) + [t for out in tail for t in _samples(out)])
        assert len(lost) < len(full)  # the buffers' and bins' tokens, never delivered


def test_merged_buffers_larger_than_a_block_allows_drain_first():
    from pipeloom.datapipes.runtime import load_held

    pipe = IterableWrapper([[9]] * 3).shuffle(buffer_size=2).pack(4, buffer_size=1)
    states = {
        "buffer": [[1], [2]],
        "stamps": [(None, 0, 0, 0)] * 2,
        "rng": None,
        "source_done": False,
    }
    bins = {
        "bins": [[[5, 5]]],
        "free": [2],
        "stamps": [(None, 0, 1, 0)],
        "ready": [],
        "done": False,
    }
    rest = iter(pipe)
    load_held(pipe, {"index": 0, "total": 1, "blocks": {0: [bins, bins], 1: [states, states]}})
    got = sorted(t for values, _, _ in rest for t in values.tolist() if t)
    assert got == sorted([5, 5, 5, 5, 1, 2, 1, 2, 9, 9, 9])


def test_the_next_epoch_is_a_fresh_run_with_the_new_rank_count():
    _, tail = _elastic("threads", plain, 3, 2, 4)
    for rank in range(2):
        service = _service("threads", plain, 2, rank)
        try:
            resumed = list(service.start_epoch(0, {"kind": "rest", "rest": _rest(plain, 3, 4)}))
            assert resumed == tail[rank]
            after = list(service.start_epoch(1, None))
        finally:
            service.shutdown()
        fresh = _service("threads", plain, 2, rank)
        try:
            assert after == list(fresh.start_epoch(1, None))
        finally:
            fresh.shutdown()


def _rest(build, old, step) -> RestOfEpoch:
    ranks = [
        {"elastic": _epoch("in-process", build, old, rank, stop=step)[1], "padding": False}
        for rank in range(old)
    ]
    return rest_of_epoch(ranks)


def _threads_rest(build, old, step) -> RestOfEpoch:
    ranks = [
        {"elastic": _epoch("threads", build, old, rank, stop=step)[1], "padding": False}
        for rank in range(old)
    ]
    assert any(r["elastic"]["skip"] for r in ranks)  # a position half delivered
    return rest_of_epoch(ranks)


def test_rest_of_epoch_round_trips_and_rejects_damage():
    rest = RestOfEpoch(group_size=2, old_total=2, frontiers=(4, 3), skips=(0, 1))
    assert RestOfEpoch.from_dict(rest.to_dict()) == rest
    assert rest.skip(0) == 1  # group 3 (old rank 1's, half delivered) is the first left
    with pytest.raises(StateError, match="frontiers"):
        RestOfEpoch.from_dict({**rest.to_dict(), "frontiers": [4]})


def _rest_service(kind, build, total, index, rest):
    service = _service(kind, build, total, index)
    return service, service.start_epoch(0, {"kind": "rest", "rest": rest})


@pytest.mark.parametrize(("kind", "build"), [("in-process", plain), ("threads", expanded)])
def test_a_checkpoint_in_the_rest_resumes_on_the_same_ranks_not_on_others(kind, build):
    if build is plain:
        rest = _rest(build, 2, 3)
    else:  # inside a position: the in-process rank cannot say which outputs it delivered
        with pytest.raises(StateError, match="FlatMapper"):
            _rest(build, 2, 4)
        rest = _threads_rest(build, 2, 4)
    for rank in range(3):
        service, outputs = _rest_service(kind, build, 3, rank, rest)
        try:
            head = list(itertools.islice(outputs, 2))
            state = service.state_dict()
            picture = rank_picture(service, 0)
            tail = list(outputs)
        finally:
            service.shutdown()
        resumed = _epoch(kind, build, 3, rank, state)[0]
        assert head + resumed == head + tail  # the same ranks: exactly where it was
        assert "resumes on the same number of ranks" in picture["blocker"]


def test_merge_rank_states_checks_it_has_one_state_per_rank_at_one_step():
    def state(rank, world, delivered=3):
        service = {"kind": "distributed", "rank": rank, "world_size": world}
        return {"epoch": 0, "delivered": delivered, "service": service}

    joined = merge_rank_states([state(1, 2), state(0, 2)])
    assert [s["rank"] for s in joined["service"]["ranks"]] == [0, 1]
    assert joined["delivered"] == 3 and joined["service"]["world_size"] == 2
    with pytest.raises(StateError, match=r"one state from each of ranks 0 \.\. 1"):
        merge_rank_states([state(0, 2), state(0, 2)])
    with pytest.raises(StateError, match="different steps"):
        merge_rank_states([state(0, 2), state(1, 2, delivered=4)])
    with pytest.raises(StateError, match="DistributedReadingService"):
        merge_rank_states([{"epoch": 0, "delivered": 0, "service": {"kind": "in-process"}}])


def test_strategies_without_a_frontier_refuse_with_the_ones_that_have_one():
    service = MultiProcessingReadingService(2, strategy="economic")
    service.set_outer_sharding(2, 0)
    service.initialize(plain().batch(2))
    try:
        picture = rank_picture(service, 0)
    finally:
        service.shutdown()
    assert "economic strategy" in picture["blocker"]
    assert "MultiProcessingReadingService (classic strategy)" in picture["blocker"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_a_sharded_map_style_source_read_by_workers_resumes_only_on_as_many_ranks(workers):
    # SequenceWrapper(...).to_iter() is its own sharding point, which the new ranks cannot
    # start at the rest of an epoch: they failed with a bare TypeError in the sharding
    # arithmetic; now the job state says so, as it does in-process, and resumes on as many
    def build():
        return SequenceWrapper(list(range(8))).to_iter()

    def inner():
        if workers == "threads":
            return ThreadReadingService(1)
        return MultiProcessingReadingService(2, start_method="fork", timeout=30)

    def stop(world, rank):
        with DataLoader(build(), rank_service(world, rank, inner=inner), seed=0) as loader:
            epoch = iter(loader)
            head = [next(epoch) for _ in range(3)]
            return head, loader.state_dict()

    ((head, state),) = ok(run_ranks(1, stop))
    joined = merge_rank_states([state])

    def resume(world, rank):
        with DataLoader(build(), rank_service(world, rank, inner=inner), seed=0) as loader:
            loader.load_state_dict(joined)
            return list(loader)

    for rank, result in enumerate(run_ranks(2, resume)):
        assert result[:2] == ("error", "StateError"), f"rank {rank}: {result}"
        assert "sharding point is MapToIter" in result[2], result[2]
        assert "resume it on the same number of ranks" in result[2], result[2]
    assert head + ok(run_ranks(1, resume))[0] == list(range(8))


def _pairs(x):
    return [x, x + 100]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("step", [3, 4, 5])
def test_new_ranks_without_workers_drop_the_outputs_delivered_of_a_begun_position(step):
    # An old rank with worker threads saves a position some of whose flatmap outputs it
    # delivered; new ranks in-process restarted that position and delivered them again
    # (IterableWrapper(range(13)).sharding_filter().flatmap(pairs), 1 rank -> 2, after 4
    # items: 1 and 101 twice). They now drop them, as new ranks with workers do, and a
    # checkpoint in that rest resumes on them exactly.
    def build():
        return IterableWrapper(range(13)).sharding_filter().flatmap(_pairs)

    def stop(world, rank):
        inner = lambda: ThreadReadingService(1)  # noqa: E731
        with DataLoader(build(), rank_service(world, rank, inner=inner), seed=0) as loader:
            epoch = iter(loader)
            return [next(epoch) for _ in range(step)], loader.state_dict()

    ((head, state),) = ok(run_ranks(1, stop))
    joined = merge_rank_states([state])

    def resume(inner, again=None):
        def body(world, rank):
            with DataLoader(build(), rank_service(world, rank, inner=inner), seed=0) as loader:
                loader.load_state_dict(joined if again is None else again[rank][1])
                epoch = iter(loader)
                first = [next(epoch) for _ in range(1 if again is None else 0)]
                return first, loader.state_dict(), first + list(epoch)

        return ok(run_ranks(2, body))

    with_workers = [rest for _, _, rest in resume(lambda: ThreadReadingService(1))]
    in_process = resume(None)
    assert [rest for _, _, rest in in_process] == with_workers
    got = head + [x for rest in with_workers for x in rest]
    assert len(got) == len(set(got))  # each once (uneven="shortest" may drop a tail)
    stopped_again = [(first, state) for first, state, _ in in_process]
    resumed = resume(None, again=stopped_again)
    assert [first + rest for (first, _), (_, _, rest) in zip(stopped_again, resumed)] == (
        with_workers
    )
