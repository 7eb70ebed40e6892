"""Tests of ``pack`` (Packer)."""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import IterableWrapper, reset_pipeline
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.helpers import Flaky, WithPosition
from tests.datapipes.sequences import (
    check_services_and_elastic_resume,
    numbered_sequences,
    plain,
    segments_of,
)

configs = st.fixed_dictionaries(
    {
        "max_length": st.integers(1, 12),
        "strategy": st.sampled_from(["first_fit", "best_fit"]),
        "buffer_size": st.integers(1, 5),
    }
)


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(0, 12), max_size=30), config=configs)
def test_every_sequence_lands_whole_in_one_row_with_its_segment_and_positions(lengths, config):
    limit = config["max_length"]
    sequences = numbered_sequences([min(n, limit) for n in lengths])
    rows = plain(collect(IterableWrapper(sequences).pack(**config)))
    found = []
    for values, segment_ids, positions in rows:
        assert len(values) == len(segment_ids) == len(positions) == limit
        used = sum(1 for s in segment_ids if s)
        assert segment_ids[:used] == sorted(segment_ids[:used]) and 0 not in segment_ids[:used]
        assert values[used:] == [0] * (limit - used) and positions[used:] == [0] * (limit - used)
        for segment in segments_of(values, segment_ids):
            found.append(segment)
        for number in set(segment_ids[:used]):
            ps = [p for p, s in zip(positions, segment_ids) if s == number]
            assert ps == list(range(len(ps)))
    assert sorted(found) == sorted(s for s in sequences if s)


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 10), max_size=40), config=configs)
def test_never_more_than_buffer_size_bins_are_open(lengths, config):
    limit = config["max_length"]
    pipe = IterableWrapper(numbered_sequences([min(n, limit) for n in lengths])).pack(**config)
    reset_pipeline(pipe)
    while True:
        assert len(pipe.state_dict()["bins"]) <= config["buffer_size"]
        try:
            pipe.async_next()
        except StopIteration:
            break


def test_best_fit_chooses_the_tightest_bin_and_first_fit_the_earliest():
    sizes = [6, 8, 2]  # bins of 10: [6] has 4 left, [8] has 2 left; then 2 arrives
    sequences = [[n] * n for n in sizes]

    def rows(strategy):
        out = plain(collect(IterableWrapper(sequences).pack(10, strategy)))
        return [[x for x in values if x] for values, _, _ in out]

    assert rows("best_fit") == [[8] * 8 + [2, 2], [6] * 6]
    assert rows("first_fit") == [[6] * 6 + [2, 2], [8] * 8]


def test_when_no_bin_has_room_the_fullest_open_bin_is_emitted():
    sequences = [[1] * 5, [2] * 7, [3] * 6]  # two bins of 10 open; 6 fits neither
    rows = plain(collect(IterableWrapper(sequences).pack(10, buffer_size=2)))
    assert [[x for x in values if x] for values, _, _ in rows] == [[2] * 7, [1] * 5, [3] * 6]


def test_buffer_size_one_packs_in_order():
    rows = plain(collect(IterableWrapper([[1] * 3, [2] * 3, [3] * 5, [4]]).pack(6, buffer_size=1)))
    assert [v for v, _, _ in rows] == [[1, 1, 1, 2, 2, 2], [3] * 5 + [4]]


def test_oversized_sequences_are_split_by_default():
    rows = plain(collect(IterableWrapper([list(range(1, 11)), [20]]).pack(4)))
    assert rows == [
        ([1, 2, 3, 4], [1, 1, 1, 1], [0, 1, 2, 3]),
        ([5, 6, 7, 8], [1, 1, 1, 1], [0, 1, 2, 3]),
        ([9, 10, 20, 0], [1, 1, 2, 0], [0, 1, 0, 0]),
    ]


def test_oversized_sequences_can_be_truncated_or_refused():
    rows = plain(collect(IterableWrapper([list(range(1, 11))]).pack(4, oversized="truncate")))
    assert rows == [([1, 2, 3, 4], [1, 1, 1, 1], [0, 1, 2, 3])]
    with pytest.raises(ValueError, match=r"length 10 > max_length=4; pass oversized='split'"):
        collect(IterableWrapper([list(range(10))]).pack(4, oversized="error"))


def test_dict_items_pack_every_field_with_its_own_padding_and_keep_metadata():
    items = [
        {"input_ids": torch.tensor([5, 6, 7]), "labels": torch.tensor([6, 7, 8]), "src": "a"},
        {"input_ids": torch.tensor([9]), "labels": torch.tensor([10]), "src": "b"},
    ]
    (row,) = collect(IterableWrapper(items).pack(6, pad_value={"input_ids": 0, "labels": -100}))
    assert row["input_ids"].dtype == torch.int64
    assert plain(row) == {
        "input_ids": [5, 6, 7, 9, 0, 0],
        "labels": [6, 7, 8, 10, -100, -100],
        "src": ["a", "b"],
        "segment_ids": [1, 1, 1, 2, 0, 0],
        "positions": [0, 1, 2, 0, 0, 0],
    }


def test_arrays_keep_their_dtype_and_trailing_dimensions():
    frames = [np.ones((2, 3), dtype=np.float32), np.full((1, 3), 2, dtype=np.float32)]
    (row,) = collect(IterableWrapper(frames).pack(4, pad_value=-1.0))
    values, segment_ids, _ = row
    assert values.dtype == torch.float32 and values.shape == (4, 3)
    assert values[:, 0].tolist() == [1, 1, 2, -1]
    assert segment_ids.tolist() == [1, 1, 2, 0]


def test_empty_sequences_are_dropped():
    rows = plain(collect(IterableWrapper([[], [1, 2], []]).pack(3)))
    assert rows == [([1, 2, 0], [1, 1, 0], [0, 1, 0])]


def test_rows_carry_the_stamp_of_their_first_sequence():
    pipe = WithPosition(IterableWrapper([[1] * 3, [2] * 3, [3] * 3]).pack(4, buffer_size=2))
    assert [(plain(row[0]), position) for row, position in collect(pipe)] == [
        ([1, 1, 1, 0], 0),
        ([2, 2, 2, 0], 1),
        ([3, 3, 3, 0], 2),
    ]


@pytest.mark.parametrize("strategy", ["first_fit", "best_fit"])
def test_resume_from_every_step(strategy):
    lengths = [3, 7, 2, 9, 1, 4, 4, 6, 2, 8, 5]
    check_resume_from_every_step(
        lambda: (
            Flaky(numbered_sequences(lengths), seed=2).pack(8, strategy, buffer_size=3).map(plain)
        )
    )


def test_the_async_path_gives_the_same_rows():
    sequences = numbered_sequences([3, 5, 2, 7, 1, 8, 4])
    expected = plain(collect(IterableWrapper(sequences).pack(8, buffer_size=2)))
    assert plain(collect_async(Flaky(sequences).pack(8, buffer_size=2))) == expected


def test_the_state_holds_the_open_bins_items_as_they_came():
    items = [torch.arange(1, 6), torch.full((6,), 6), torch.tensor([7, 7])]
    pipe = IterableWrapper(items).pack(8, buffer_size=4)
    reset_pipeline(pipe)
    first = pipe.async_next()  # 6 + 2 fill the second bin exactly; the first stays open
    assert plain(first[0]) == [6] * 6 + [7, 7]
    state = pickle.loads(pickle.dumps(pipe.state_dict()))
    assert plain(state["bins"]) == [[[1, 2, 3, 4, 5]]] and state["free"] == [3]
    assert isinstance(state["bins"][0][0], torch.Tensor)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((0,), {}, ValueError, r"max_length to be an int >= 1, got 0"),
        ((4, "next_fit"), {}, ValueError, r"strategy must be 'best_fit'"),
        ((4, "best_fit", 0), {}, ValueError, r"buffer_size to be an int >= 1, got 0"),
        ((4,), {"oversized": "drop"}, ValueError, r"oversized must be 'split', 'truncate'"),
        ((4,), {"pad_value": "x"}, TypeError, r"pad_value to be a number or a dict"),
    ],
)
def test_bad_arguments_say_what_was_expected(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        IterableWrapper([[1]]).pack(*args, **kwargs)


@pytest.mark.parametrize(
    ("items", "error", "match"),
    [
        ([7], TypeError, r"needs sequences .* got int 7"),
        ([{"a": 1}], TypeError, r"a dict with no sequence value"),
        ([{"a": [1, 2], "b": [1]}], ValueError, r"must have one length, got \{'a': 2, 'b': 1\}"),
        ([{"a": [1], "positions": [0]}], ValueError, r"already have a 'positions' field"),
    ],
)
def test_bad_items_say_what_was_expected(items, error, match):
    with pytest.raises(error, match=match):
        collect(IterableWrapper(items).pack(4))


def test_repr_and_no_length():
    pipe = IterableWrapper([[1]]).pack(16, "first_fit", 4)
    assert repr(pipe) == (
        "Packer(max_length=16, strategy='first_fit', buffer_size=4, oversized='split')"
    )
    with pytest.raises(TypeError, match="has no length"):
        len(pipe)


def test_the_token_multiset_is_kept_for_random_lengths():
    rng = np.random.default_rng(0)
    sequences = [rng.integers(1, 100, int(n)).tolist() for n in rng.integers(1, 40, 200)]
    rows = plain(collect(IterableWrapper(sequences).pack(32)))
    kept = Counter(x for values, _, _ in rows for x in values if x)
    assert kept == Counter(x for s in sequences for x in s)


def lengths_to_sequence(n):
    return list(range(1, n % 11 + 2))


@pytest.mark.timeout(120)
def test_the_same_rows_under_threads_and_processes_and_after_a_resume_on_more_workers():
    check_services_and_elastic_resume(
        lambda: (
            IterableWrapper(range(60))
            .shuffle()
            .sharding_filter()
            .map(lengths_to_sequence)
            .pack(16, buffer_size=3)
            .batch(2)
            .collate()
        )
    )
