"""Attacks on the mixing, packing and bucketing blocks and their resume.

Each test is a property an outside tester checked: a full epoch is the same
in-process, in threads and in processes with the block before or after the
sharding point; a state taken at any step (right after a load too, and over a
chain of resumes) resumes into a fresh loader on another service and gives
the uninterrupted tail; mixing, packing and bucketing pass every sample on
exactly once; an epoch resumed on another number of ranks delivers every
sample once.
"""

from __future__ import annotations

import collections
import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, IterDataPipe
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)
from pipeloom.testing import check_resume_from_every_step, collect

SERVICES: dict[str, Callable[[], Any]] = {
    "in-process": InProcessReadingService,
    "threads-1": lambda: ThreadReadingService(1),
    "threads-3": lambda: ThreadReadingService(3),
    "processes-2": lambda: MultiProcessingReadingService(
        2, strategy="classic", start_method="fork", timeout=30
    ),
}


def _plain(x: Any) -> Any:
    """Tensors as lists, so outputs compare with ``==``."""
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(i) for i in x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def _sequences(count: int, seed: int = 7) -> list[list[int]]:
    rng = random.Random(seed)
    return [[i * 100 + j for j in range(1, rng.randint(1, 9))] for i in range(count)]


def _epoch(make: Callable[[], IterDataPipe], service: str, epochs: int = 1) -> list[list[Any]]:
    with DataLoader(make(), SERVICES[service](), seed=5) as loader:
        result = [_plain(list(loader)) for _ in range(epochs)]
    return result


# -- a source merged from workers cannot be restarted mid-epoch ---------------------


def _cycled_mix_of_a_worker_fed_source() -> IterDataPipe:
    # The sharded source (3 items) runs out first and must restart: the workers
    # produce each epoch once.
    return (
        IterableWrapper(range(3))
        .sharding_filter()
        .mux(IterableWrapper(range(100, 110)), stop="cycle")
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("service", ["threads-1", "processes-2"])
def test_mux_cycle_restarting_a_source_merged_from_workers_raises_instead_of_hanging(service):
    # Was: threads raised QueueBroken("producer thread exited without closing the
    # ThreadQueue"), processes waited out the timeout ("no item arrived within 60 s").
    with pytest.raises(RuntimeError, match=r"restarts it mid-epoch.*sharding_filter\(\)"):
        _epoch(_cycled_mix_of_a_worker_fed_source, service)


def _cycled_separate_process() -> IterDataPipe:
    from tests.reading_service.test_separate import InOwnProcess

    side = InOwnProcess(IterableWrapper(range(3))).cycle(3)
    return IterableWrapper(range(12)).sharding_filter().map(abs).batch(2).zip(side)


@pytest.mark.timeout(60)
def test_a_cycle_over_a_separate_process_raises_instead_of_dropping_its_rounds():
    # Was: the second round read the ended stream, so the cycle stopped after one
    # round: 3 outputs under processes where the in-process run gives 6.
    assert len(_epoch(_cycled_separate_process, "in-process")[0]) == 6
    with pytest.raises(RuntimeError, match=r"SeparateProcessReader.*restarts it mid-epoch"):
        _epoch(_cycled_separate_process, "processes-2")


# -- restarting one branch of a fork or demux ---------------------------------------


def _forked_mix_cycled() -> IterDataPipe:
    a, b = IterableWrapper(range(5)).fork(2)
    return a.mux(b.map(_plus_100), weights=[2, 1], stop="cycle")


def _cycled_fork_child_mixed() -> IterDataPipe:
    a, b = IterableWrapper(range(5)).fork(2)
    return a.mux(b.map(_plus_100).cycle(3), weights=[1, 3], stop="all")


def _cycled_demux_child_mixed() -> IterDataPipe:
    a, b = IterableWrapper(range(6)).demux(2, _parity)
    return a.mux(b.cycle(3), weights=[1, 3], stop="all")


def _plus_100(x: int) -> int:
    return x + 100


def _parity(x: int) -> int:
    return x % 2


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "make", [_forked_mix_cycled, _cycled_fork_child_mixed, _cycled_demux_child_mixed]
)
def test_restarting_one_branch_of_a_fork_or_demux_is_refused(make):
    # Was: restarting one child restarted the shared parent, so the other child read
    # its items again: cycle() gave [100, 0, 101, 102, 103, 1, 104, 100, 101, 0, ...]
    # (0 and 1 three times each), mux(stop="cycle") an endless epoch that never
    # delivered 103 and 104.
    with pytest.raises(ValueError, match=r"restarts .* also read by .*fork\(2\)"):
        collect(make())
    with pytest.raises(ValueError, match=r"restarts .* also read by"):
        DataLoader(make())


def test_a_cycle_before_the_fork_or_inside_one_branch_is_accepted():
    a, b = IterableWrapper(range(3)).cycle(2).fork(2)
    assert collect(a.zip(b)) == [(i, i) for i in [0, 1, 2, 0, 1, 2]]
    a, b = IterableWrapper(range(3)).fork(2)
    own = IterableWrapper(range(10, 12)).cycle(2)  # its own branch
    assert collect(a.zip(b, own)) == [(0, 0, 10), (1, 1, 11), (2, 2, 10)]
    mixed = IterableWrapper(range(2)).mux(IterableWrapper(range(10, 15)), stop="cycle")
    assert collect(mixed) == [0, 10, 1, 11, 0, 12, 1, 13, 0, 14, 1]


# -- nested repetition draws new seeds in every round -------------------------------


def _nested_cycles() -> IterDataPipe:
    return IterableWrapper(range(6)).shuffle().cycle(2).cycle(2)


def _cycled_mix_of_a_cycled_mix() -> IterDataPipe:
    # The inner mix restarts the shuffle once per run (6 of 12); the outer one restarts
    # the inner mix once (24 of 48).
    shuffled = IterableWrapper(range(6)).shuffle()
    inner = shuffled.mux(IterableWrapper(range(100, 112)), stop="cycle")
    return inner.mux(IterableWrapper(range(1000, 1048)), stop="cycle")


def test_a_cycle_inside_a_cycle_reshuffles_in_every_outer_round():
    # Was: the inner cycle set its source back to round 0 when the outer one restarted
    # it, so every outer round replayed the first one's shuffles exactly.
    out = collect(_nested_cycles())
    passes = [out[i : i + 6] for i in range(0, 24, 6)]
    assert all(sorted(p) == list(range(6)) for p in passes)
    assert len({tuple(p) for p in passes}) == 4
    check_resume_from_every_step(_nested_cycles)


def test_a_cycled_mix_restarted_by_another_reshuffles_its_sources():
    out = [x for x in collect(_cycled_mix_of_a_cycled_mix()) if x < 100]
    # Each run of the inner mix: two passes over the shuffle and the first item of a
    # third, drawn before the inner mix sees its second source has run out too.
    first, second = out[:13], out[13:26]
    for run in (first, second):
        assert sorted(run[:6]) == sorted(run[6:12]) == list(range(6))
    assert first[:12] != second[:12]
    check_resume_from_every_step(_cycled_mix_of_a_cycled_mix)


# -- the same epoch everywhere, and exact resume across services --------------------


def _length(x: list) -> int:
    return len(x)


def _values(row: Any) -> list[int]:
    return row[0].tolist()


def _negated(x: int) -> int:
    return -x - 1


def _forked_mix() -> IterDataPipe:
    a, b = IterableWrapper(range(30)).shuffle(buffer_size=4).fork(2)
    return a.mux(b.map(_negated), weights=[1, 2], stop="all").sharding_filter()


BLOCKS: dict[str, Callable[[], IterDataPipe]] = {
    "mux weighted, before": lambda: (
        IterableWrapper(range(30))
        .mux(IterableWrapper(range(100, 113)), weights=[1, 3], stop="all")
        .sharding_filter()
    ),
    "mux random cycle, before": lambda: (
        IterableWrapper(range(7))
        .shuffle()
        .mux(IterableWrapper(range(100, 113)), weights=[0.3, 0.7], stop="cycle", sampling="random")
        .sharding_filter()
    ),
    "mux after, one source from workers": lambda: (
        IterableWrapper(range(20))
        .sharding_filter()
        .mux(IterableWrapper(range(100, 110)), weights=[2, 1], stop="all")
    ),
    "mux of fork children, before": _forked_mix,
    "pack after": lambda: (
        IterableWrapper(_sequences(40))
        .sharding_filter()
        .shuffle(buffer_size=5)
        .pack(8, buffer_size=3)
        .map(_values)
    ),
    "pack before": lambda: (
        IterableWrapper(_sequences(40))
        .pack(8, "first_fit", buffer_size=3)
        .sharding_filter()
        .map(_values)
    ),
    "bucket_by_length estimated, after": lambda: (
        IterableWrapper(_sequences(50))
        .sharding_filter()
        .bucket_by_length(_length, num_buckets=3, batch_sizes=3, buffer_size=7)
    ),
    "bucket_by_length max_tokens drop_last, before": lambda: (
        IterableWrapper(_sequences(50))
        .bucket_by_length(_length, boundaries=[4], max_tokens=12, buffer_size=7, drop_last=True)
        .sharding_filter()
    ),
    "bucketbatch after": lambda: (
        IterableWrapper(range(53)).sharding_filter().bucketbatch(3, batch_num=4, bucket_num=2)
    ),
    "max_token_bucketize after": lambda: (
        IterableWrapper(_sequences(50)).sharding_filter().max_token_bucketize(12, buffer_size=5)
    ),
    "in_batch_shuffle after": lambda: (
        IterableWrapper(range(40)).sharding_filter().batch(4).in_batch_shuffle()
    ),
    "nested cycles, before": lambda: (
        IterableWrapper(range(5)).shuffle().cycle(2).cycle(2).sharding_filter()
    ),
    "concat of shuffles, before": lambda: (
        IterableWrapper(range(7))
        .shuffle()
        .concat(IterableWrapper(range(50, 61)).shuffle())
        .sharding_filter()
    ),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_two_epochs_are_the_same_in_threads_and_processes(name):
    expected = _epoch(BLOCKS[name], "in-process", epochs=2)
    assert expected[0]
    for service in ("threads-1", "threads-3", "processes-2"):
        assert _epoch(BLOCKS[name], service, epochs=2) == expected, service


def _resume_chain(make, services: list[str], steps: list[int], *, reload_at_once: bool):
    """Deliver ``steps[0]`` items, save; load into a fresh loader on the next service,
    (optionally save again at once, before any item, and load that), and so on; the
    last loader reads the rest of the epoch and the next one."""
    got: list[Any] = []
    state = None
    for service, step in zip(services, steps):
        with DataLoader(make(), SERVICES[service](), seed=5) as loader:
            if state is not None:
                loader.load_state_dict(state)
            if reload_at_once:
                state = loader.state_dict()
                continue_with = DataLoader(make(), SERVICES[service](), seed=5)
                loader.shutdown()
                loader = continue_with
                loader.load_state_dict(state)
            with loader:
                items = iter(loader)
                got += [_plain(next(items)) for _ in range(step)]
                state = loader.state_dict()
    with DataLoader(make(), SERVICES[services[-1]](), seed=5) as loader:
        loader.load_state_dict(state)
        got += _plain(list(loader))
        after = _plain(list(loader))
    return got, after


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_a_chain_of_resumes_on_other_services_gives_the_uninterrupted_epoch(name):
    make = BLOCKS[name]
    expected = _epoch(make, "in-process", epochs=2)
    size = len(expected[0])
    rng = random.Random(name)
    names = sorted(SERVICES)
    for reload_at_once in (False, True):
        services = [rng.choice(names) for _ in range(3)]
        steps = sorted(rng.randrange(size + 1) for _ in range(2))
        steps = [steps[0], steps[1] - steps[0], 0]  # the last one: a state at once
        got, after = _resume_chain(make, services, steps, reload_at_once=reload_at_once)
        assert got == expected[0], (services, steps, reload_at_once)
        assert after == expected[1], (services, steps, reload_at_once)


# -- exactly once: mixing, packing, bucketing ---------------------------------------

_WEIGHTS = st.sampled_from([0, 1, 2, 3, 5, 0.5, 0.25, 7])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 12), _WEIGHTS), min_size=1, max_size=5),
    st.sampled_from(["smooth", "random"]),
)
def test_mux_stop_all_passes_every_item_of_every_weighted_source_once_in_order(spec, sampling):
    if not any(weight for _, weight in spec):
        return
    sources = [IterableWrapper([(i, j) for j in range(n)]) for i, (n, _) in enumerate(spec)]
    weights = [weight for _, weight in spec]
    out = collect(sources[0].mux(*sources[1:], weights=weights, stop="all", sampling=sampling))
    for i, (n, weight) in enumerate(spec):
        assert [j for s, j in out if s == i] == (list(range(n)) if weight else [])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 20), max_size=25),
    st.integers(1, 9),
    st.integers(1, 4),
    st.sampled_from(["best_fit", "first_fit"]),
)
def test_pack_split_puts_every_token_in_exactly_one_row_in_order(lengths, width, bins, strategy):
    sequences = [[i * 1000 + j + 1 for j in range(n)] for i, n in enumerate(lengths)]
    pieces = []
    for values, segments, positions in collect(
        IterableWrapper(sequences).pack(width, strategy, bins)
    ):
        assert values.shape[0] == width and (values[segments == 0] == 0).all()
        for segment in range(1, int(segments.max()) + 1):
            mask = segments == segment
            piece = values[mask].tolist()
            assert positions[mask].tolist() == list(range(len(piece)))
            assert piece == list(range(piece[0], piece[0] + len(piece)))  # a contiguous run
            pieces.append(piece)
    tokens = sorted(t for piece in pieces for t in piece)
    assert tokens == sorted(t for sequence in sequences for t in sequence)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 12), max_size=40),
    st.integers(1, 30),
    st.booleans(),
    st.booleans(),
)
def test_bucket_by_length_passes_every_item_once_and_drops_only_leftovers(
    lengths, buffer_size, estimated, drop_last
):
    items = list(enumerate(lengths))  # (id, length)
    edges = {"num_buckets": 3} if estimated else {"boundaries": [3, 7]}
    batches = collect(
        IterableWrapper(items).bucket_by_length(
            _second, batch_sizes=3, buffer_size=buffer_size, drop_last=drop_last, **edges
        )
    )
    seen = [x for batch in batches for x in batch]
    assert len(seen) == len(set(seen)) and set(seen) <= set(items)
    if drop_last:
        # Only the end's leftovers go: under a batch per bucket (a full buffer emits
        # its largest bucket as it is, short or not).
        assert len(items) - len(seen) < 3 * 3
    else:
        assert sorted(seen) == items


def _second(item: tuple[int, int]) -> int:
    return item[1]


# -- exactly once over an epoch resumed on another number of ranks ------------------


ELASTIC = {
    "bucket_by_length drop_last after": lambda: (
        IterableWrapper(_sequences(50))
        .sharding_filter()
        .bucket_by_length(_length, boundaries=[3, 6], batch_sizes=3, buffer_size=7, drop_last=True)
    ),
    "bucket_by_length estimated after": lambda: (
        IterableWrapper(_sequences(50))
        .sharding_filter()
        .bucket_by_length(_length, num_buckets=3, max_tokens=14, buffer_size=6)
    ),
    "mux before, pack after": lambda: (
        IterableWrapper(_sequences(30))
        .mux(IterableWrapper([[5000 + i] for i in range(9)]), weights=[2, 1], stop="all")
        .sharding_filter()
        .pack(8, buffer_size=3)
        .map(_values)
    ),
    "nested cycles before, shuffle after": lambda: (
        IterableWrapper(_sequences(9))
        .shuffle()
        .cycle(2)
        .cycle(2)
        .sharding_filter()
        .shuffle(buffer_size=3)
    ),
}


def _flat(outputs: list) -> list:
    flat: list = []
    for output in outputs:
        if output and isinstance(output[0], list):
            flat.extend(t for sequence in output for t in sequence)
        else:
            flat.extend(t for t in output if t)
    return flat


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(ELASTIC))
def test_an_epoch_resumed_on_another_number_of_ranks_delivers_each_sample_once(name):
    from tests.reading_service.test_elastic import _elastic
    from tests.reading_service.test_elastic import _epoch as _rank_epoch

    build = ELASTIC[name]
    full = collections.Counter(_flat(_rank_epoch("in-process", build, 1, 0)[0]))
    for kind, (old, new), step in itertools.product(
        ["in-process", "threads"], [(2, 3), (3, 2), (4, 3)], [0, 3, 7]
    ):
        head, tail = _elastic(kind, build, old, new, step)
        got = collections.Counter(_flat(head) + [t for out in tail for t in _flat(out)])
        if "drop_last" in name:  # each rank drops its own leftovers
            every = collections.Counter(t for sequence in _sequences(50) for t in sequence)
            assert max(got.values()) == 1 and not got - every, (kind, old, new, step)
        else:
            assert got == full, (kind, old, new, step)


def test_the_resume_check_compares_tensor_outputs():
    # Was: "Boolean value of Tensor with more than one value is ambiguous" for any
    # pipeline whose outputs hold tensors (every pack pipeline).
    check_resume_from_every_step(lambda: IterableWrapper(_sequences(12)).pack(6, buffer_size=2))


def test_the_restart_traits_leave_checkpoint_fingerprints_as_they_were():
    from pipeloom._fingerprint import pipeline_fingerprint

    pipe = IterableWrapper(range(3)).mux(IterableWrapper(range(2)), stop="cycle").cycle(2)
    blocks = dict(pipeline_fingerprint(pipe)["blocks"][:2])
    assert sorted(blocks["Multiplexer"]) == ["sampling", "seed", "stop", "weights"]
    assert sorted(blocks["Cycler"]) == ["count"]
