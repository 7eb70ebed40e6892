"""round_robin_demux: items dealt out to several streams in turn."""

from __future__ import annotations

import pytest

from pipeloom.datapipes import IterableWrapper
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere


def test_deals_items_in_turn():
    first, second = IterableWrapper(range(5)).round_robin_demux(2)
    assert (list(first), list(second)) == ([0, 2, 4], [1, 3])
    a, b, c = IterableWrapper(range(7)).round_robin_demux(3)
    assert list(a.zip(b, c)) == [(0, 1, 2), (3, 4, 5)]


def test_one_instance_is_the_source_itself():
    source = IterableWrapper(range(3))
    assert source.round_robin_demux(1) == [source]


def test_errors():
    with pytest.raises(ValueError, match="num_instances must be an int >= 1, got 0"):
        IterableWrapper([]).round_robin_demux(0)
    first, _ = IterableWrapper(range(10)).round_robin_demux(2, buffer_size=2)
    with pytest.raises(BufferError, match="round_robin_demux buffer of 2 items is full"):
        list(first)


def test_resume_from_every_step():
    check_resume_from_every_step(lambda: IterableWrapper(range(9)).round_robin_demux(3)[2])


def test_same_output_everywhere():
    def make():
        evens, odds = IterableWrapper(range(12)).round_robin_demux(2)
        return evens.zip(odds).sharding_filter()

    epochs = check_same_output_everywhere(make)
    assert epochs[0] == [(i, i + 1) for i in range(0, 12, 2)]
