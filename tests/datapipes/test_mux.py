"""Tests for Multiplexer."""

from __future__ import annotations

import json
import pathlib
import pickle
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import (
    IterableWrapper,
    IterDataPipe,
    Multiplexer,
    SequenceWrapper,
    current_position,
    load_pipeline_state_dict,
    pipeline_state_dict,
    reset_pipeline,
    seed_pipeline,
)
from pipeloom.errors import StateError
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.helpers import Flaky, drain_retrying
from tests.datapipes.sequences import check_services_and_elastic_resume
from tests.strategies import item_lists


class WithPosition(IterDataPipe):
    inputs = ("source",)

    def __init__(self, source):
        self.source = source

    def async_next(self):
        item = self.source.async_next()
        return item, current_position()

    def state_dict(self):
        return {}


def test_matches_torchdata_example():
    dp1, dp2, dp3 = (IterableWrapper(range(n, n + k)) for n, k in ((0, 3), (10, 5), (20, 5)))
    dp = dp1.mux(dp2, dp3)
    assert list(dp) == [0, 10, 20, 1, 11, 21, 2, 12, 22]
    assert len(dp) == 9
    assert repr(dp) == "Multiplexer()"


@settings(max_examples=50, deadline=None)
@given(lists=st.lists(item_lists, min_size=1, max_size=4))
def test_yields_complete_rounds_until_the_shortest_is_exhausted(lists):
    dp = Multiplexer(*(IterableWrapper(x) for x in lists))
    expected = [x for round_ in zip(*lists) for x in round_]
    assert list(dp) == expected
    assert len(dp) == len(expected)


def test_each_item_keeps_its_own_stamp():
    dp = WithPosition(IterableWrapper("abc").mux(IterableWrapper("xyz")))
    assert collect(dp) == [("a", 0), ("x", 0), ("b", 1), ("y", 1), ("c", 2), ("z", 2)]


def test_retrying_after_not_available_and_async_path():
    def make():
        return Flaky(range(6), seed=1).mux(Flaky(range(10, 17), seed=2))

    expected = [0, 10, 1, 11, 2, 12, 3, 13, 4, 14, 5, 15]
    assert drain_retrying(make()) == expected
    assert collect_async(make()) == expected


def test_stop_iteration_repeats_until_reset():
    dp = IterableWrapper([1]).mux(IterableWrapper([]))
    reset_pipeline(dp)
    for _ in range(2):
        with pytest.raises(StopIteration):
            dp.async_next()


def test_non_iter_inputs_are_rejected():
    match = r"mux\(\) argument 2 must be an IterDataPipe, got SequenceWrapper"
    with pytest.raises(TypeError, match=match):
        IterableWrapper([1]).mux(SequenceWrapper([1]))


def test_resume_from_every_step():
    check_resume_from_every_step(
        lambda: Flaky(range(5)).mux(IterableWrapper(range(10, 17)), IterableWrapper("abcdef"))
    )


# -- mux_longest and stop="all" ---------------------------------------------------


def round_robin_longest(lists):
    """torchdata 0.9's mux_longest, written out: skip exhausted streams."""
    iterators, finished, out = [iter(x) for x in lists], set(), []
    while len(finished) < len(iterators):
        for i, it in enumerate(iterators):
            if i not in finished:
                try:
                    out.append(next(it))
                except StopIteration:
                    finished.add(i)
    return out


def test_mux_longest_matches_torchdata_example():
    dp1, dp2, dp3 = (IterableWrapper(range(n, n + 5)) for n in (0, 10, 20))
    dp = dp1.mux_longest(dp2, dp3)
    assert list(dp) == [0, 10, 20, 1, 11, 21, 2, 12, 22, 3, 13, 23, 4, 14, 24]
    assert len(dp) == 15
    assert repr(dp) == "Multiplexer(stop='all', sampling='smooth')"


MUX_LONGEST_CASES = json.loads(
    (pathlib.Path(__file__).parent / "fixtures" / "torchdata_mixing.json").read_text()
)["mux_longest"]


@pytest.mark.parametrize("case", MUX_LONGEST_CASES)
def test_mux_longest_gives_torchdata_0_9_recorded_output(case):
    lists = case["lists"]
    dp = IterableWrapper(lists[0]).mux_longest(*(IterableWrapper(x) for x in lists[1:]))
    assert collect(dp) == case["expected"]


@settings(max_examples=50, deadline=None)
@given(lists=st.lists(item_lists, min_size=1, max_size=4))
def test_mux_longest_skips_exhausted_streams_until_all_are(lists):
    dp = IterableWrapper(lists[0]).mux_longest(*(IterableWrapper(x) for x in lists[1:]))
    assert list(dp) == round_robin_longest(lists)
    assert len(dp) == sum(map(len, lists))


# -- weighted mixing ----------------------------------------------------------------

weight_lists = st.lists(
    st.one_of(st.integers(0, 12), st.floats(0.001, 5, allow_nan=False).map(lambda x: round(x, 3))),
    min_size=1,
    max_size=5,
).filter(any)


def sources_of(weights, size=400):
    return [IterableWrapper([i] * size) for i in range(len(weights))]


def shares(weights):
    exact = [Fraction(repr(float(w))) for w in weights]
    return [w / sum(exact) for w in exact]


@settings(max_examples=60, deadline=None)
@given(weights=weight_lists)
def test_smooth_mix_keeps_every_prefix_within_one_item_of_its_share(weights):
    out = list(Multiplexer(*sources_of(weights), weights=weights))
    p, k = shares(weights), sum(1 for w in weights if w)
    bound = 0 if k == 1 else 1 - Fraction(1, 2 * k - 2)
    counts = [0] * len(weights)
    for n, source in enumerate(out, 1):
        counts[source] += 1
        assert all(abs(c - n * s) <= bound for c, s in zip(counts, p)), (n, counts)
    assert len(out) >= 399  # "first": ends when the first source runs out


@settings(max_examples=30, deadline=None)
@given(weights=st.lists(st.integers(1, 7), min_size=1, max_size=4))
def test_integer_weights_repeat_with_period_their_sum(weights):
    out = list(Multiplexer(*sources_of(weights, 100), weights=weights))
    period = sum(weights)
    first = out[:period]
    assert [first.count(i) for i in range(len(weights))] == weights
    assert out[period : 2 * period] == first


def test_equal_weights_are_round_robin_and_float_weights_are_read_as_decimals():
    assert collect(Multiplexer(*sources_of([1, 1, 1], 3), weights=[2, 2, 2])) == [0, 1, 2] * 3
    out = collect(Multiplexer(*sources_of([1, 1], 50), weights=[0.7, 0.3]))
    assert [out[:10].count(0), out[:10].count(1)] == [7, 3]
    assert out[10:20] == out[:10]


def test_random_sampling_follows_the_weights_and_the_seed():
    def make(seed=None):
        return Multiplexer(*sources_of([3, 1], 20000), weights=[3, 1], sampling="random", seed=seed)

    out = collect(make(), seed=5)
    assert abs(out[:8000].count(0) / 8000 - 0.75) < 0.02
    assert collect(make(), seed=5) == out
    assert collect(make(), seed=6)[:200] != out[:200]
    assert collect(make(), seed=5, epoch=1)[:200] != out[:200]
    assert collect(make(seed=1), seed=5)[:200] == collect(make(seed=1), seed=9)[:200]


def test_zero_weight_sources_are_never_read():
    out = collect(Multiplexer(*sources_of([1, 0, 2], 10), weights=[1, 0, 2], stop="all"))
    assert sorted(out) == [0] * 10 + [2] * 10


def test_stop_first_ends_when_the_chosen_source_runs_out():
    a, b = IterableWrapper("ab"), IterableWrapper(range(10))
    assert collect(Multiplexer(a, b, weights=[1, 1])) == ["a", 0, "b", 1]


def test_stop_all_continues_with_the_rest_in_their_proportions():
    def make(stop):
        a, b, c = IterableWrapper("ab"), IterableWrapper(range(10)), IterableWrapper("XYZUVW")
        return Multiplexer(a, b, c, weights=[1, 2, 1], stop=stop)

    head = [0, "a", "X", 1, 2, "b", "Y", 3]  # two periods of 1:2:1
    assert collect(make("first")) == head + [4]  # then "a" runs out
    # "a" leaves; b and c go on 2:1 until b runs out, then c alone
    assert collect(make("all")) == head + [4, "Z", 5, 6, "U", 7, 8, "V", 9, "W"]


def test_stop_cycle_restarts_short_sources_with_new_seeds_until_each_ran_out_once():
    short = IterableWrapper(range(4)).shuffle()
    long = IterableWrapper("abcdefghijkl")
    out = collect(Multiplexer(short, long, weights=[1, 1], stop="cycle"), seed=3)
    numbers = [x for x in out if isinstance(x, int)]
    assert "".join(x for x in out if isinstance(x, str)) == "abcdefghijkl"
    assert len(numbers) == 13  # the 13th is taken before "long" is found exhausted
    rounds = [numbers[i : i + 4] for i in range(0, 12, 4)]
    assert all(sorted(r) == [0, 1, 2, 3] for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # each round reshuffled
    assert collect(Multiplexer(short, long, weights=[1, 1], stop="cycle"), seed=3) == out


def test_iterating_the_same_epoch_again_gives_the_same_cycled_mix():
    pipe = Multiplexer(
        IterableWrapper(range(5)).shuffle(), IterableWrapper("abcdefghijklmn"), stop="cycle"
    )
    seed_pipeline(pipe, 1)
    first = list(pipe)
    assert list(pipe) == first  # restarted sources are back at round 0


def test_stop_cycle_drops_a_source_that_yields_nothing_instead_of_spinning():
    empty, short = IterableWrapper([]), IterableWrapper([1, 2])
    out = collect(Multiplexer(empty, short, IterableWrapper("abcde"), stop="cycle"))
    assert out == [1, "a", 2, "b", 1, "c", 2, "d", 1, "e", 2]


def test_items_keep_their_own_stamps_when_weighted():
    dp = WithPosition(Multiplexer(IterableWrapper("ab"), IterableWrapper("xyz"), weights=[1, 2]))
    assert collect(dp) == [("x", 0), ("a", 0), ("y", 1), ("z", 2), ("b", 1)]


@pytest.mark.parametrize("stop", ["first", "all", "cycle"])
@pytest.mark.parametrize("sampling", ["smooth", "random"])
def test_weighted_resume_from_every_step(stop, sampling):
    check_resume_from_every_step(
        lambda: (
            Flaky(range(5))
            .shuffle()
            .mux(
                IterableWrapper(range(10, 17)),
                Flaky("abc", seed=3),
                weights=[2, 1, 0.5],
                stop=stop,
                sampling=sampling,
            )
        )
    )


def test_resuming_with_new_weights_applies_them_from_the_resume_point():
    def make(weights):
        return Multiplexer(*sources_of([1, 1], 100), weights=weights)

    pipe = make([1, 1])
    reset_pipeline(pipe)
    head = [pipe.async_next() for _ in range(7)]
    state = pipeline_state_dict(pipe)
    assert head == [0, 1, 0, 1, 0, 1, 0]
    resumed = make([3, 1])
    reset_pipeline(resumed)
    load_pipeline_state_dict(resumed, state)
    tail = [resumed.async_next() for _ in range(8)]
    assert tail == [0, 0, 1, 0] * 2  # 3:1 from the resume point on, as a fresh 3:1 mix
    same = make([2, 2])  # the same proportions: the counts carry on
    reset_pipeline(same)
    load_pipeline_state_dict(same, state)
    assert [same.async_next() for _ in range(3)] == [1, 0, 1]


def test_weighted_state_is_plain_counts():
    pipe = Multiplexer(*sources_of([1, 2]), weights=[1, 2], stop="cycle")
    reset_pipeline(pipe)
    for _ in range(5):
        pipe.async_next()
    state = pipe.state_dict()
    assert state["counts"] == [2, 3] and state["weights"] == [1, 2]
    assert pickle.loads(pickle.dumps(state)) == state


def test_a_state_for_another_number_of_sources_is_refused():
    pipe = Multiplexer(*sources_of([1, 1]), weights=[1, 1])
    with pytest.raises(StateError, match="not a weighted mux state over 2 sources"):
        pipe.load_state_dict({"counts": [0, 0, 0]})


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"weights": [1]}, ValueError, r"got 2 sources but 1 weights"),
        ({"weights": [1, -1]}, ValueError, r"finite and >= 0, got -1"),
        ({"weights": [1, float("nan")]}, ValueError, r"finite and >= 0, got nan"),
        ({"weights": [0, 0]}, ValueError, r"at least one positive weight"),
        ({"weights": [1, "2"]}, TypeError, r"weights must be numbers, got str '2'"),
        ({"weights": [True, 1]}, TypeError, r"weights must be numbers, got bool"),
        ({"stop": "longest"}, ValueError, r"stop must be one of 'first', 'all', 'cycle'"),
        ({"sampling": "uniform"}, ValueError, r"sampling must be 'smooth'"),
    ],
)
def test_bad_arguments_say_what_was_expected(kwargs, error, match):
    with pytest.raises(error, match=match):
        IterableWrapper([1]).mux(IterableWrapper([2]), **kwargs)


def test_weighted_mux_has_no_length_and_a_readable_repr():
    dp = IterableWrapper([1]).mux(IterableWrapper([2]), weights=[0.7, 0.3], stop="cycle")
    assert repr(dp) == "Multiplexer(weights=[0.7, 0.3], stop='cycle', sampling='smooth')"
    with pytest.raises(TypeError, match="has no length"):
        len(dp)


@pytest.mark.parametrize("weights", [None, [1, 1]])
def test_a_source_with_several_outputs_per_position_keeps_its_own_stamp(weights):
    """An unbatch (or tar reader) does not re-stamp its later outputs; mixing must not leak
    another source's stamp into them, or item_rng() would differ from a worker's run."""
    batches = WithPosition(IterableWrapper([[], [10, 11, 12]]).unbatch())
    letters = WithPosition(IterableWrapper("wxyz"))
    out = collect(Multiplexer(batches, letters, weights=weights))
    assert out == [(10, 1), ("w", 0), (11, 1), ("x", 1), (12, 1), ("y", 2)]


def tagged(x):
    return ("sharded", x)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sampling", ["smooth", "random"])
def test_a_mix_after_the_workers_is_the_same_under_threads_and_processes_and_resumes_elastically(
    sampling,
):
    check_services_and_elastic_resume(
        lambda: (
            IterableWrapper(range(40))
            .shuffle()
            .sharding_filter()
            .map(tagged)
            .mux(
                IterableWrapper(range(100, 120)).shuffle(),
                weights=[3, 1],
                stop="all",
                sampling=sampling,
            )
        )
    )


def test_random_sampling_without_weights_draws_equally():
    out = collect(Multiplexer(*sources_of([1, 1], 5000), sampling="random"), seed=2)
    assert out[:12] != [0, 1] * 6
    assert abs(out[:4000].count(0) / 4000 - 0.5) < 0.03
