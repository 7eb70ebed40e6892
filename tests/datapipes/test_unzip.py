"""unzip (iter and map): one stream per position of the items."""

from __future__ import annotations

import pytest

from pipeloom.datapipes import IterableWrapper, SequenceWrapper
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere

ROWS = [(i, i + 10, i + 20) for i in range(3)]


def test_one_stream_per_position():
    first, second, third = IterableWrapper(ROWS).unzip(sequence_length=3)
    assert (list(first), list(second), list(third)) == ([0, 1, 2], [10, 11, 12], [20, 21, 22])


def test_columns_to_skip_and_zip_back():
    first, third = IterableWrapper(ROWS).unzip(3, columns_to_skip=[1])
    assert list(first.zip(third)) == [(0, 20), (1, 21), (2, 22)]


def test_a_child_too_far_ahead_hits_the_buffer():
    first, second = IterableWrapper([(i, i) for i in range(10)]).unzip(2, buffer_size=3)
    with pytest.raises(BufferError, match="unzip buffer of 3 items is full"):
        list(first)
    del second


def test_map_style_unzip():
    numbers, letters = SequenceWrapper([(0, "a"), (1, "b")]).unzip(sequence_length=2)
    assert (numbers[1], letters[0], len(letters)) == (1, "a", 2)
    (only,) = SequenceWrapper([(0, "a")]).unzip(2, columns_to_skip=[0])
    assert only[0] == "a"


def test_errors():
    with pytest.raises(ValueError, match="sequence_length must be an int >= 1, got 0"):
        IterableWrapper([]).unzip(0)
    with pytest.raises(ValueError, match="skips every one of the 2 columns"):
        IterableWrapper([]).unzip(2, columns_to_skip=[0, 1])
    with pytest.raises(
        ValueError, match=r"columns_to_skip must hold positions in \[0, 2\), got \[5\]"
    ):
        SequenceWrapper([]).unzip(2, columns_to_skip=[5])
    first, _ = IterableWrapper([(1, 2, 3)]).unzip(2)
    with pytest.raises(ValueError, match="got an item of length 3"):
        list(first)


def test_resume_from_every_step():
    check_resume_from_every_step(lambda: IterableWrapper(ROWS * 2).unzip(3)[1])


def test_same_output_everywhere():
    def make():
        first, second = IterableWrapper([(i, -i) for i in range(8)]).shuffle().unzip(2)
        return first.zip(second).sharding_filter()

    epochs = check_same_output_everywhere(make)
    assert all(a == -b for a, b in epochs[0]) and len(epochs[0]) == 8
