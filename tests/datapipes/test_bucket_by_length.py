"""Tests of ``bucket_by_length`` (LengthBucketer)."""

from __future__ import annotations

import bisect
import pickle
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import IterableWrapper, reset_pipeline
from pipeloom.datapipes._bucket_by_length import equal_cost_boundaries
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.helpers import Flaky, WithPosition
from tests.datapipes.sequences import check_services_and_elastic_resume


def words(lengths):
    """Distinct items of the given lengths: ('x' * n, i)."""
    return [("x" * n, i) for i, n in enumerate(lengths)]


def size(item):
    return len(item[0])


boundary_lists = st.lists(st.integers(1, 20), max_size=4, unique=True).map(sorted)


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 24), max_size=60),
    boundaries=boundary_lists,
    batch_size=st.integers(1, 6),
    buffer_size=st.integers(1, 20),
)
def test_batch_sizes_every_item_once_one_bucket_per_batch_bounded_buffer(
    lengths, boundaries, batch_size, buffer_size
):
    items = words(lengths)
    pipe = IterableWrapper(items).bucket_by_length(
        size, boundaries=boundaries, batch_sizes=batch_size, buffer_size=buffer_size
    )
    reset_pipeline(pipe)
    batches = []
    while True:
        state = pipe.state_dict()
        assert sum(map(len, state["buckets"])) <= buffer_size
        try:
            batches.append(pipe.async_next())
        except StopIteration:
            break
    assert Counter(x for b in batches for x in b) == Counter(items)
    for batch in batches:
        assert 1 <= len(batch) <= batch_size
        assert len({bisect.bisect_right(boundaries, size(x)) for x in batch}) == 1


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 16), max_size=60),
    boundaries=boundary_lists,
    max_tokens=st.integers(16, 64),
    drop_last=st.booleans(),
)
def test_max_tokens_bounds_the_padded_size_of_every_batch(
    lengths, boundaries, max_tokens, drop_last
):
    items = words(lengths)
    batches = collect(
        IterableWrapper(items).bucket_by_length(
            size, boundaries=boundaries, max_tokens=max_tokens, drop_last=drop_last
        )
    )
    for batch in batches:
        assert len(batch) * max(map(size, batch)) <= max_tokens
    delivered = Counter(x for b in batches for x in b)
    assert delivered <= Counter(items)
    if not drop_last:
        assert delivered == Counter(items)


def test_full_buckets_come_out_as_they_fill_and_leftovers_at_the_end_in_bucket_order():
    lengths = [1, 5, 2, 6, 1, 7, 3, 2]
    batches = collect(
        IterableWrapper(words(lengths)).bucket_by_length(size, boundaries=[4], batch_sizes=2)
    )
    assert [[size(x) for x in b] for b in batches] == [[1, 2], [5, 6], [1, 3], [2], [7]]
    dropped = IterableWrapper(words(lengths)).bucket_by_length(
        size, boundaries=[4], batch_sizes=2, drop_last=True
    )
    assert [[size(x) for x in b] for b in collect(dropped)] == [[1, 2], [5, 6], [1, 3]]


def test_batch_sizes_per_bucket():
    lengths = [1, 9, 1, 9, 1, 9, 9]
    pipe = IterableWrapper(words(lengths)).bucket_by_length(
        size, boundaries=[5], batch_sizes=[3, 2]
    )
    assert [[size(x) for x in b] for b in collect(pipe)] == [[9, 9], [1, 1, 1], [9, 9]]


def test_a_full_buffer_emits_the_bucket_holding_the_most_items():
    lengths = [1, 9, 1, 9, 9]  # buffer of 4: the fifth item overflows it
    pipe = IterableWrapper(words(lengths)).bucket_by_length(
        size, boundaries=[5], batch_sizes=10, buffer_size=4
    )
    assert [[size(x) for x in b] for b in collect(pipe)] == [[9, 9, 9], [1, 1]]


def test_max_tokens_closes_a_batch_before_an_item_that_would_not_fit():
    lengths = [2, 2, 4, 1, 4]
    pipe = IterableWrapper(words(lengths)).bucket_by_length(size, boundaries=[100], max_tokens=8)
    # [2, 2] then 4 arrives: 3 x 4 = 12 > 8, so [2, 2] goes; [4, 1] then 4: 3 x 4 > 8
    assert [[size(x) for x in b] for b in collect(pipe)] == [[2, 2], [4, 1], [4]]


def test_max_tokens_closes_a_batch_that_no_item_of_its_bucket_could_join():
    pipe = IterableWrapper(words([5, 5, 6])).bucket_by_length(size, boundaries=[5], max_tokens=10)
    reset_pipeline(pipe)
    # bucket [5, inf): two items of 5 make 10; a third of at least 5 cannot join
    assert [size(x) for x in pipe.async_next()] == [5, 5]


def test_num_buckets_estimates_equal_cost_edges_from_the_first_buffer_of_each_epoch():
    lengths = [1, 1, 1, 1, 2, 2, 4] * 3
    pipe = IterableWrapper(words(lengths)).bucket_by_length(
        size, num_buckets=3, batch_sizes=2, buffer_size=7
    )
    reset_pipeline(pipe)
    first = pipe.async_next()
    assert pipe.state_dict()["boundaries"] == [2, 3]
    assert [size(x) for x in first] == [1, 1]
    batches = [first, *collect(pipe)[1:]]
    assert all(len({bisect.bisect_right([2, 3], size(x)) for x in b}) == 1 for b in batches)


def test_estimated_buckets_keep_their_batch_sizes_when_lengths_repeat():
    # A sample of one length: the 2 edges coincide ([3, 3]), the middle bucket holds
    # no length, and the longest bucket keeps the last (smallest) batch size.
    lengths = [2] * 6 + [50] * 3
    pipe = IterableWrapper(words(lengths)).bucket_by_length(
        size, num_buckets=3, batch_sizes=[4, 3, 1], buffer_size=6
    )
    reset_pipeline(pipe)
    first, edges = pipe.async_next(), pipe.state_dict()["boundaries"]
    batches = [first, *collect(pipe)[1:]]
    assert [[size(x) for x in b] for b in batches] == [[2] * 4, [50], [50], [50], [2, 2]]
    assert edges == [3, 3]


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 50), min_size=1, max_size=80), count=st.integers(1, 6))
def test_equal_cost_boundaries_balance_the_tokens(lengths, count):
    edges = equal_cost_boundaries(lengths, count)
    assert edges == sorted(set(edges)) and len(edges) <= count - 1
    buckets: dict[int, list[int]] = {}
    for n in lengths:
        buckets.setdefault(bisect.bisect_right(edges, n), []).append(n)
    share = sum(lengths) / count
    for members in buckets.values():
        # a bucket passes its share by at most the items of one length (ties never split)
        one_length = max(n * members.count(n) for n in members)
        assert sum(members) <= share + one_length


def test_batches_carry_the_stamp_of_their_first_item():
    pipe = WithPosition(
        IterableWrapper(words([1, 5, 1, 5])).bucket_by_length(size, boundaries=[3], batch_sizes=2)
    )
    assert [position for _, position in collect(pipe)] == [0, 1]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"boundaries": [3, 6], "batch_sizes": 2, "buffer_size": 5},
        {"boundaries": [4], "max_tokens": 12, "drop_last": True},
        {"num_buckets": 3, "batch_sizes": [2, 3, 1], "buffer_size": 6},
        {"num_buckets": 2, "max_tokens": 20, "buffer_size": 50},
        {"num_buckets": 6, "batch_sizes": [2, 1, 3, 2, 5, 1], "buffer_size": 6},  # edges repeat
    ],
)
def test_resume_from_every_step(kwargs):
    lengths = [1, 7, 3, 9, 2, 2, 5, 8, 1, 4, 6, 3, 10, 2]
    check_resume_from_every_step(
        lambda: Flaky(words(lengths), seed=3).bucket_by_length(size, **kwargs)
    )


def test_async_path_gives_the_same_batches():
    items = words([3, 1, 4, 1, 5, 9, 2, 6])

    def make(source):
        return source.bucket_by_length(size, num_buckets=2, batch_sizes=2, buffer_size=4)

    assert collect_async(make(Flaky(items))) == collect(make(IterableWrapper(items)))


def test_the_state_holds_the_items_as_they_came_and_the_estimated_edges():
    items = words([3, 1, 4, 1, 5, 9, 2, 6])
    pipe = IterableWrapper(items).bucket_by_length(
        size, num_buckets=2, batch_sizes=3, buffer_size=4
    )
    reset_pipeline(pipe)
    pipe.async_next()  # reads the 4 items of the sample, estimates, then fills the buckets
    state = pickle.loads(pickle.dumps(pipe.state_dict()))
    assert state["sample"] == [] and state["boundaries"] == [4]
    held = [entry[0] for bucket in state["buckets"] for entry in bucket]
    assert set(held) <= set(items) and len(held) <= 4


def test_errors_while_iterating_say_what_was_wrong():
    too_long = IterableWrapper(words([3, 30])).bucket_by_length(size, boundaries=[5], max_tokens=16)
    with pytest.raises(ValueError, match=r"item of length 30 > max_tokens=16"):
        collect(too_long)
    bad_length = IterableWrapper([1]).bucket_by_length(lambda x: "1", boundaries=[5], batch_sizes=1)
    with pytest.raises(TypeError, match=r"to return an int >= 0 .*, got str '1'"):
        collect(bad_length)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_sizes": 2}, ValueError, r"either boundaries=\[...\] .* not neither"),
        ({"boundaries": [2], "num_buckets": 2, "batch_sizes": 2}, ValueError, r"not both"),
        ({"boundaries": [2]}, ValueError, r"either batch_sizes= .* not neither"),
        ({"boundaries": [2], "batch_sizes": 2, "max_tokens": 9}, ValueError, r"not both"),
        ({"boundaries": [3, 2], "batch_sizes": 2}, ValueError, r"increase strictly, got \[3, 2\]"),
        ({"boundaries": [0], "batch_sizes": 2}, ValueError, r"boundaries to be int\(s\) >= 1"),
        ({"boundaries": [2], "batch_sizes": [1, 2, 3]}, ValueError, r"2 buckets but got 3"),
        ({"num_buckets": 0, "batch_sizes": 1}, ValueError, r"num_buckets to be int\(s\) >= 1"),
        ({"boundaries": [2], "max_tokens": 0}, ValueError, r"max_tokens to be int\(s\) >= 1"),
        ({"boundaries": [2], "batch_sizes": 1, "buffer_size": 0}, ValueError, r"buffer_size"),
        ({"boundaries": [2], "batch_sizes": 1, "drop_last": 0}, TypeError, r"drop_last must be"),
    ],
)
def test_bad_arguments_say_what_was_expected(kwargs, error, match):
    with pytest.raises(error, match=match):
        IterableWrapper([]).bucket_by_length(len, **kwargs)


def test_repr():
    pipe = IterableWrapper([]).bucket_by_length(len, num_buckets=4, max_tokens=4096)
    assert repr(pipe) == (
        "LengthBucketer(length_fn=len, num_buckets=4, max_tokens=4096, buffer_size=1000, "
        "drop_last=False)"
    )


def lengths_to_word(n):
    return ("x" * (n % 13), n)


@pytest.mark.timeout(120)
def test_the_same_batches_under_threads_and_processes_and_after_a_resume_on_more_workers():
    check_services_and_elastic_resume(
        lambda: (
            IterableWrapper(range(80))
            .shuffle()
            .sharding_filter()
            .map(lengths_to_word)
            .bucket_by_length(size, num_buckets=3, max_tokens=40, buffer_size=10)
        )
    )


@pytest.mark.parametrize("wrap", [np.int64, torch.tensor, lambda n: torch.tensor([n])])
def test_a_length_fn_may_return_a_numpy_integer_or_an_integer_tensor(wrap):
    items = words([1, 7, 2, 8, 3])
    plain = collect(IterableWrapper(items).bucket_by_length(size, boundaries=[5], batch_sizes=2))
    wrapped = IterableWrapper(items).bucket_by_length(
        lambda x: wrap(size(x)), boundaries=[5], batch_sizes=2
    )
    assert collect(wrapped) == plain


@pytest.mark.parametrize("length", [np.bool_(True), torch.tensor(True), torch.tensor(2.0)])
def test_a_length_fn_returning_a_bool_or_a_float_tensor_is_named(length):
    dp = IterableWrapper([1]).bucket_by_length(lambda x: length, boundaries=[5], batch_sizes=1)
    with pytest.raises(TypeError, match=r"to return an int >= 0 \(a NumPy integer"):
        collect(dp)
