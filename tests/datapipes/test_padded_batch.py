"""Tests of ``padded_batch`` and ``PadCollate``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, PadCollate, PaddedBatch
from pipeloom.reading_service import MultiProcessingReadingService
from pipeloom.testing import check_resume_from_every_step, collect
from tests.datapipes.helpers import Flaky
from tests.datapipes.sequences import numbered_sequences, plain


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=20),
    batch_size=st.integers(1, 5),
    multiple=st.sampled_from([None, 1, 4]),
)
def test_each_batch_is_padded_to_its_longest_sequence(lengths, batch_size, multiple):
    sequences = numbered_sequences(lengths)
    batches = collect(
        IterableWrapper(sequences).padded_batch(
            batch_size, pad_value=-1, pad_to_multiple_of=multiple
        )
    )
    chunks = [sequences[i : i + batch_size] for i in range(0, len(sequences), batch_size)]
    assert len(batches) == len(chunks)
    for batch, chunk in zip(batches, chunks):
        assert isinstance(batch, PaddedBatch)
        longest = max(map(len, chunk))
        if multiple:
            longest = -(-longest // multiple) * multiple
        assert batch.values.shape == (len(chunk), longest)
        assert batch.lengths.tolist() == [len(s) for s in chunk]
        for row, mask, sequence in zip(batch.values.tolist(), batch.mask.tolist(), chunk):
            assert row == sequence + [-1] * (longest - len(sequence))
            assert mask == [True] * len(sequence) + [False] * (longest - len(sequence))


def test_dicts_pad_each_field_with_its_value_and_collate_the_rest():
    items = [
        {"input_ids": [1, 2, 3], "labels": [2, 3, 4], "source": "web", "weight": 0.5},
        {"input_ids": [5], "labels": [6], "source": "code", "weight": 1.0},
    ]
    (batch,) = collect(
        IterableWrapper(items).padded_batch(2, pad_value={"labels": -100}, pad_to_multiple_of=4)
    )
    assert plain(batch) == {
        "input_ids": [[1, 2, 3, 0], [5, 0, 0, 0]],
        "labels": [[2, 3, 4, -100], [6, -100, -100, -100]],
        "source": ["web", "code"],
        "weight": [0.5, 1.0],
        "lengths": [3, 1],
        "attention_mask": [[True, True, True, False], [True, False, False, False]],
    }


def test_fields_of_other_lengths_pad_to_their_own_longest_and_length_key_picks_the_mask():
    items = [{"source": [1, 2], "target": [7]}, {"source": [3], "target": [8, 9, 9]}]
    pad = PadCollate(length_key="target", mask_key="target_mask", lengths_key=None)
    batch = plain(pad(items))
    assert batch == {
        "source": [[1, 2], [3, 0]],
        "target": [[7, 0, 0], [8, 9, 9]],
        "target_mask": [[True, False, False], [True, True, True]],
    }


def test_tensors_and_arrays_keep_dtype_and_trailing_dimensions():
    frames = [np.ones((3, 2), dtype=np.float32), torch.zeros((1, 2), dtype=torch.float32)]
    batch = PadCollate(pad_value=0.5)(frames)
    assert batch.values.dtype == torch.float32 and batch.values.shape == (2, 3, 2)
    assert batch.values[1].tolist() == [[0, 0], [0.5, 0.5], [0.5, 0.5]]
    assert batch.mask.shape == (2, 3)


def test_pads_the_lists_that_bucketing_or_batch_makes():
    pipe = IterableWrapper([[1], [2, 2], [3, 3, 3]]).batch(3).collate(PadCollate())
    (batch,) = collect(pipe)
    assert batch.values.tolist() == [[1, 0, 0], [2, 2, 0], [3, 3, 3]]
    assert "PadCollate(pad_value=0, pad_to_multiple_of=None)" in repr(pipe)


def test_drop_last_drops_the_short_batch():
    batches = collect(IterableWrapper([[1], [2], [3]]).padded_batch(2, drop_last=True))
    assert [b.values.tolist() for b in batches] == [[[1], [2]]]


def test_resume_from_every_step():
    check_resume_from_every_step(
        lambda: Flaky(numbered_sequences([3, 1, 4, 1, 5, 9, 2, 6])).padded_batch(3).map(plain)
    )


def seq_of(x):
    return list(range(x % 5 + 1))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["classic", "economic", "chunked"])
def test_runs_in_the_workers_under_every_strategy_and_gives_the_in_process_batches(strategy):
    def build():
        return IterableWrapper(range(23)).sharding_filter().map(seq_of).padded_batch(4)

    expected = plain(list(DataLoader(build(), seed=0)))
    service = MultiProcessingReadingService(2, strategy=strategy, timeout=60)
    with DataLoader(build(), service, seed=0) as loader:
        placement = str(loader.placement())
        assert plain(list(loader)) == expected
    padding = next(line for line in placement.splitlines() if "PadCollate" in line)
    assert padding.startswith(("worker processes", "item worker processes"))  # all batch there


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"pad_to_multiple_of": 0}, ValueError, r"pad_to_multiple_of must be None or an int >= 1"),
        ({"pad_value": [0]}, TypeError, r"pad_value to be a number or a dict"),
        ({"mask_key": 3}, TypeError, r"mask_key must be a str or None, got 3"),
    ],
)
def test_bad_arguments_say_what_was_expected(kwargs, error, match):
    with pytest.raises(error, match=match):
        PadCollate(**kwargs)


@pytest.mark.parametrize(
    ("batch", "error", "match"),
    [
        ([], ValueError, r"empty batch"),
        ([3, 4], TypeError, r"pads sequences .* entry is int 3"),
        ([np.ones((2, 2)), np.ones((2, 3))], ValueError, r"differ after it: shapes"),
        ([{"a": [1]}, {"b": [1]}], ValueError, r"the first has key 'a', another item lacks it"),
        ([{"a": [1], "lengths": 3}], ValueError, r"adds 'lengths', but the items already have"),
        ([{"a": 1}], ValueError, r"needs a sequence field to measure"),
    ],
)
def test_bad_batches_say_what_is_wrong(batch, error, match):
    with pytest.raises(error, match=match):
        PadCollate()(batch)
