"""Grouper (groupby): items collected by key."""

from __future__ import annotations

import os
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.datapipes import Grouper, IterableWrapper
from pipeloom.testing import check_resume_from_every_step, collect_async
from tests.datapipes.everywhere import check_same_output_everywhere
from tests.datapipes.helpers import Flaky

FILES = ["a.png", "b.png", "a.json", "b.json", "a.jpg", "c.json"]


def stem(path):
    return os.path.splitext(path)[0]


def test_groups_by_key_in_first_appearance_order():
    assert list(IterableWrapper(FILES).groupby(stem)) == [
        ["a.png", "a.json", "a.jpg"],
        ["b.png", "b.json"],
        ["c.json"],
    ]
    assert list(IterableWrapper(FILES).groupby(stem, keep_key=True))[1] == (
        "b",
        ["b.png", "b.json"],
    )


def test_group_size_yields_full_groups_at_once():
    assert list(IterableWrapper(FILES).groupby(stem, group_size=2)) == [
        ["a.png", "a.json"],
        ["b.png", "b.json"],
        ["a.jpg"],
        ["c.json"],
    ]


def test_a_full_buffer_gives_up_its_largest_group():
    dp = IterableWrapper(FILES).groupby(stem, buffer_size=3, group_size=3, guaranteed_group_size=2)
    assert list(dp) == [["a.png", "a.json"], ["b.png", "b.json"], ["a.jpg"], ["c.json"]]
    keyed = IterableWrapper(FILES).groupby(
        stem, keep_key=True, buffer_size=3, group_size=3, guaranteed_group_size=2
    )
    assert list(keyed)[0] == ("a", ["a.png", "a.json"])  # the group's own key


def test_too_small_groups_raise_or_are_dropped():
    items = ["a1", "b1", "c1", "a2"]
    small = IterableWrapper(items).groupby(lambda s: s[0], buffer_size=2, group_size=2)
    with pytest.raises(RuntimeError, match="largest group \\(key 'a'\\) has 1 items, fewer than"):
        list(small)
    dropped = IterableWrapper(items).groupby(
        lambda s: s[0], buffer_size=2, group_size=2, drop_remaining=True
    )
    assert list(dropped) == [["a2"]]  # a1, b1, c1 each left a full buffer alone: dropped


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=40), st.sampled_from([None, 2, 3]))
def test_every_item_is_in_exactly_one_group_of_its_key(keys, group_size):
    groups = list(
        IterableWrapper(list(enumerate(keys))).groupby(lambda t: t[1], group_size=group_size)
    )
    assert sorted(i for group in groups for i, _ in group) == list(range(len(keys)))
    assert all(len({k for _, k in group}) == 1 for group in groups)
    if group_size:
        assert all(len(group) <= group_size for group in groups)
    by_key = defaultdict(list)
    for group in groups:
        by_key[group[0][1]].extend(i for i, _ in group)
    assert all(indices == sorted(indices) for indices in by_key.values())


def test_survives_not_available():
    assert collect_async(Grouper(Flaky(FILES, seed=2), stem)) == list(
        IterableWrapper(FILES).groupby(stem)
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"group_size": 0}, "group_size must be an int >= 1 or None, got 0"),
        ({"group_size": 5, "buffer_size": 4}, r"group_size \(5\) must be <= buffer_size \(4\)"),
        ({"guaranteed_group_size": 2}, "needs group_size set"),
        (
            {"group_size": 2, "guaranteed_group_size": 3},
            "needs group_size set and at least as large",
        ),
    ],
)
def test_bad_sizes_are_explained(kwargs, message):
    with pytest.raises(ValueError, match=message):
        IterableWrapper([]).groupby(stem, **kwargs)


def test_repr():
    assert repr(IterableWrapper([]).groupby(stem, group_size=2)) == (
        "Grouper(group_key_fn=stem, keep_key=False, buffer_size=10000, group_size=2, "
        "guaranteed_group_size=2, drop_remaining=False)"
    )


def test_resume_from_every_step():
    check_resume_from_every_step(lambda: IterableWrapper(FILES * 2).groupby(stem, group_size=3))


def test_same_output_everywhere():
    epochs = check_same_output_everywhere(
        lambda: IterableWrapper(FILES * 3).shuffle().sharding_filter().groupby(stem, group_size=2)
    )
    assert sorted(x for group in epochs[0] for x in group) == sorted(FILES * 3)


def parity(x):
    return x % 2


def test_a_state_taken_while_flushing_is_not_changed_by_the_items_after_it():
    # The state held the block's live list of keys left to flush: the items delivered
    # after state_dict() emptied it, and the resume lost the last group.
    def build():
        return IterableWrapper([1, 2, 3]).groupby(parity)

    loader = DataLoader(build(), seed=0)
    iterator = iter(loader)
    assert next(iterator) == [1, 3]
    state = loader.state_dict()
    assert list(iterator) == [[2]]  # the training loop goes on after its checkpoint
    resumed = DataLoader(build(), seed=0)
    resumed.load_state_dict(state)
    assert list(resumed) == [[2]]
