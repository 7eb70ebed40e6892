"""Repeater (repeat): each item several times in a row."""

from __future__ import annotations

import pytest

from pipeloom.datapipes import IterableWrapper, Repeater, current_position, reset_pipeline
from pipeloom.datapipes.runtime import restore_stamp
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere


def test_repeats_each_item_in_place():
    dp = IterableWrapper(range(3)).repeat(3)
    assert isinstance(dp, Repeater) and repr(dp) == "Repeater(times=3)"
    assert list(dp) == [0, 0, 0, 1, 1, 1, 2, 2, 2] and len(dp) == 9


def test_each_copy_carries_its_items_position_whatever_ran_in_between():
    pipe = IterableWrapper(range(3)).repeat(2)
    reset_pipeline(pipe)
    seen = []
    for _ in range(6):
        item = pipe.async_next()
        seen.append((item, current_position()))
        restore_stamp((None, 0, 99, 0))  # e.g. a batch downstream restoring another stamp
    assert seen == [(0, 0), (0, 0), (1, 1), (1, 1), (2, 2), (2, 2)]


@pytest.mark.parametrize("bad", [1, 0, -3, 2.0, True])
def test_times_must_be_at_least_two(bad):
    with pytest.raises(ValueError, match=f"times must be an int >= 2, got {bad!r}"):
        IterableWrapper([]).repeat(bad)


def test_resume_from_every_step():
    check_resume_from_every_step(lambda: IterableWrapper(range(4)).repeat(3).batch(5))


def test_same_output_everywhere():
    epochs = check_same_output_everywhere(
        lambda: IterableWrapper(range(7)).shuffle().sharding_filter().repeat(2).batch(3)
    )
    flat = [x for batch in epochs[0] for x in batch]
    assert sorted(flat) == sorted(list(range(7)) * 2)
