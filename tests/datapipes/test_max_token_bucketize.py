"""Tests of ``max_token_bucketize`` (MaxTokenBucketizer): torchdata 0.9's meaning."""

from __future__ import annotations

import json
import pathlib
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import IterableWrapper, reset_pipeline
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.helpers import Flaky, WithPosition
from tests.datapipes.sequences import check_services_and_elastic_resume

FIXTURES = json.loads(
    (pathlib.Path(__file__).parent / "fixtures" / "torchdata_mixing.json").read_text()
)
SOURCE = ["1", "11", "1", "1111", "111", "1", "11", "11", "111"]


def test_matches_torchdata_documented_examples():
    dp = IterableWrapper(SOURCE)
    assert list(dp.max_token_bucketize(max_token_count=5)) == [
        ["1", "1", "1", "11"],
        ["11", "11"],
        ["111"],
        ["111"],
        ["1111"],
    ]
    assert list(dp.max_token_bucketize(max_token_count=4, buffer_size=4)) == [
        ["1", "1", "1"],
        ["11", "11"],
        ["11"],
        ["111"],
        ["111"],
        ["1111"],
    ]


@pytest.mark.parametrize("case", FIXTURES["max_token_bucketize"], ids=lambda c: str(c["kwargs"]))
def test_gives_torchdata_0_9_recorded_output(case):
    """Outputs recorded from torchdata 0.9 by scripts/record_torchdata_mixing.py (ties too)."""
    dp = IterableWrapper(case["items"]).max_token_bucketize(**case["kwargs"])
    assert collect(dp) == case["expected"]


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 10), max_size=50),
    budget=st.integers(10, 30),
    buffer_size=st.integers(1, 12),
    include_padding=st.booleans(),
)
def test_batches_stay_within_the_budget_and_keep_every_item_in_range(
    lengths, budget, buffer_size, include_padding
):
    items = [("x" * n, i) for i, n in enumerate(lengths)]
    batches = collect(
        IterableWrapper(items).max_token_bucketize(
            budget,
            len_fn=lambda x: len(x[0]),
            min_len=1,
            buffer_size=buffer_size,
            include_padding=include_padding,
        )
    )
    for batch in batches:
        sizes = [len(x[0]) for x in batch]
        assert (len(sizes) * max(sizes) if include_padding else sum(sizes)) <= budget
    delivered = [x for b in batches for x in b]
    assert sorted(delivered) == sorted(x for x in items if len(x[0]) >= 1)
    if buffer_size > len(items):  # one heap holds everything: shortest first
        assert [len(x[0]) for x in delivered] == sorted(len(x[0]) for x in delivered)


def test_batches_carry_the_stamp_of_their_first_item():
    dp = WithPosition(IterableWrapper(["aaa", "b", "cc"]).max_token_bucketize(3, buffer_size=3))
    assert collect(dp) == [(["b", "cc"], 1), (["aaa"], 0)]


@pytest.mark.parametrize("include_padding", [False, True])
@pytest.mark.parametrize("buffer_size", [1, 3, 100])
def test_resume_from_every_step(include_padding, buffer_size):
    check_resume_from_every_step(
        lambda: Flaky(SOURCE * 3, seed=1).max_token_bucketize(
            6, buffer_size=buffer_size, include_padding=include_padding
        )
    )


def test_async_path_and_a_plain_state_holding_the_heap_as_it_is():
    expected = collect(IterableWrapper(SOURCE).max_token_bucketize(5, buffer_size=4))
    assert collect_async(Flaky(SOURCE).max_token_bucketize(5, buffer_size=4)) == expected
    dp = IterableWrapper(SOURCE).max_token_bucketize(5, buffer_size=4)
    reset_pipeline(dp)
    dp.async_next()
    state = pickle.loads(pickle.dumps(dp.state_dict()))
    heap = [length for length, _, _ in state["heap"]]
    assert all(heap[(i - 1) // 2] <= heap[i] for i in range(1, len(heap)))  # heap order
    assert all(len(item) == length for length, item, _ in state["heap"])


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((0,), {}, ValueError, r"max_token_count to be an int >= 1, got 0"),
        ((5,), {"min_len": -1}, ValueError, r"min_len to be an int >= 0, got -1"),
        ((5,), {"min_len": 4, "max_len": 3}, ValueError, r"min_len <= max_len"),
        ((5,), {"max_len": 6}, ValueError, r"max_len <= max_token_count"),
        ((5,), {"buffer_size": 0}, ValueError, r"buffer_size to be an int >= 1, got 0"),
        (
            (5,),
            {"include_padding": "yes"},
            TypeError,
            r"include_padding must be a bool, got str .yes.",
        ),
        ((5,), {"len_fn": 3}, TypeError, r"expects len_fn to be a callable"),
    ],
)
def test_bad_arguments_say_what_was_expected(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        IterableWrapper(SOURCE).max_token_bucketize(*args, **kwargs)


def test_a_len_fn_that_returns_no_int_is_named():
    dp = IterableWrapper(SOURCE).max_token_bucketize(5, len_fn=lambda x: 1.5)
    with pytest.raises(TypeError, match=r"to return an int .*, got float 1.5"):
        collect(dp)


def test_repr():
    dp = IterableWrapper(SOURCE).max_token_bucketize(5)
    assert repr(dp) == (
        "MaxTokenBucketizer(max_token_count=5, len_fn=len, min_len=0, max_len=5, "
        "buffer_size=1000, include_padding=False)"
    )


def lengths_to_word(n):
    return "x" * (n % 9)


@pytest.mark.timeout(120)
def test_the_same_batches_under_threads_and_processes_and_after_a_resume_on_more_workers():
    check_services_and_elastic_resume(
        lambda: (
            IterableWrapper(range(80))
            .shuffle()
            .sharding_filter()
            .map(lengths_to_word)
            .max_token_bucketize(20, buffer_size=7, include_padding=True)
        )
    )


@pytest.mark.parametrize(
    "length", [np.int64(2), np.int32(2), torch.tensor(2), torch.tensor([2], dtype=torch.int8)]
)
def test_a_len_fn_may_return_a_numpy_integer_or_an_integer_tensor(length):
    words = ["ab", "cd", "ef"]
    as_int = collect(IterableWrapper(words).max_token_bucketize(4))
    assert collect(IterableWrapper(words).max_token_bucketize(4, len_fn=lambda x: length)) == as_int


@pytest.mark.parametrize("length", [np.bool_(True), torch.tensor(True), torch.tensor(1.0)])
def test_a_len_fn_returning_a_bool_or_float_tensor_is_named(length):
    dp = IterableWrapper(SOURCE).max_token_bucketize(5, len_fn=lambda x: length)
    with pytest.raises(TypeError, match=r"to return an int \(a NumPy integer"):
        collect(dp)
