"""Tests of ``concat_then_split`` (ConcatSplitter)."""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import IterableWrapper, reset_pipeline
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.helpers import Flaky, WithPosition
from tests.datapipes.sequences import check_services_and_elastic_resume, numbered_sequences, plain


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 15), max_size=25),
    limit=st.integers(1, 10),
    drop_remainder=st.booleans(),
)
def test_rows_are_the_stream_cut_every_max_length_tokens(lengths, limit, drop_remainder):
    sequences = numbered_sequences(lengths)
    stream = [x for s in sequences for x in s]
    rows = plain(
        collect(IterableWrapper(sequences).concat_then_split(limit, drop_remainder=drop_remainder))
    )
    assert all(len(values) == limit for values, _, _ in rows)
    flat = [x for values, segments, _ in rows for x, s in zip(values, segments) if s]
    full = len(stream) - len(stream) % limit
    assert flat == (stream[:full] if drop_remainder else stream)
    owner = {x: i for i, s in enumerate(sequences) for x in s}
    for values, segments, positions in rows:
        used = [(x, s, p) for x, s, p in zip(values, segments, positions) if s]
        assert [s for _, s, _ in used] == sorted(s for _, s, _ in used)
        for (x, s, p), (y, t, q) in zip(used, used[1:]):
            assert (s == t) == (owner[x] == owner[y])  # one segment per sequence part
            assert q == (p + 1 if s == t else 0)
        if used:
            assert used[0][2] == 0  # positions restart in each row


def test_remainder_is_padded_and_carried_parts_become_segments():
    rows = plain(collect(IterableWrapper([[1, 2, 3, 4, 5], [6, 7]]).concat_then_split(3)))
    assert rows == [
        ([1, 2, 3], [1, 1, 1], [0, 1, 2]),
        ([4, 5, 6], [1, 1, 2], [0, 1, 0]),
        ([7, 0, 0], [1, 0, 0], [0, 0, 0]),
    ]


def test_dict_items_keep_their_fields_in_step():
    items = [
        {"input_ids": torch.tensor([1, 2, 3]), "labels": torch.tensor([2, 3, -1])},
        {"input_ids": torch.tensor([4]), "labels": torch.tensor([-1])},
    ]
    rows = plain(collect(IterableWrapper(items).concat_then_split(3, pad_value={"labels": -100})))
    assert rows == [
        {
            "input_ids": [1, 2, 3],
            "labels": [2, 3, -1],
            "segment_ids": [1, 1, 1],
            "positions": [0, 1, 2],
        },
        {
            "input_ids": [4, 0, 0],
            "labels": [-1, -100, -100],
            "segment_ids": [1, 0, 0],
            "positions": [0, 0, 0],
        },
    ]


def test_rows_carry_the_stamp_of_the_sequence_they_start_with():
    pipe = WithPosition(IterableWrapper([[1] * 5, [2] * 2, [3] * 4]).concat_then_split(4))
    assert [position for _, position in collect(pipe)] == [0, 0, 2]


def test_resume_from_every_step_keeps_the_carried_remainder():
    lengths = [3, 11, 2, 0, 5, 7, 1]
    check_resume_from_every_step(
        lambda: Flaky(numbered_sequences(lengths), seed=4).concat_then_split(4).map(plain)
    )
    check_resume_from_every_step(
        lambda: (
            Flaky(numbered_sequences(lengths), seed=5)
            .concat_then_split(5, drop_remainder=True)
            .map(plain)
        )
    )


def test_async_path_and_a_plain_state():
    sequences = numbered_sequences([3, 9, 4, 2])
    expected = plain(collect(IterableWrapper(sequences).concat_then_split(4)))
    assert plain(collect_async(Flaky(sequences).concat_then_split(4))) == expected
    pipe = IterableWrapper(sequences).concat_then_split(4)
    reset_pipeline(pipe)
    pipe.async_next()
    pipe.async_next()  # tokens 5..8: the second sequence (4..12) is cut at 8
    state = pickle.loads(pickle.dumps(pipe.state_dict()))
    assert state["pending"] == [sequences[1]] and state["offset"] == 5


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((0,), {}, ValueError, r"max_length to be an int >= 1, got 0"),
        ((4,), {"pad_value": None}, TypeError, r"pad_value to be a number or a dict"),
        ((4,), {"drop_remainder": 1}, TypeError, r"drop_remainder to be True or False, got 1"),
    ],
)
def test_bad_arguments_say_what_was_expected(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        IterableWrapper([[1]]).concat_then_split(*args, **kwargs)


def test_repr():
    pipe = IterableWrapper([[1]]).concat_then_split(8, drop_remainder=True)
    assert repr(pipe) == "ConcatSplitter(max_length=8, drop_remainder=True)"


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
            .concat_then_split(16)
            .batch(2)
            .collate()
        )
    )
