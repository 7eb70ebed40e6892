"""random_split: named parts of a stream, the same in every epoch and run."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, SplitPart
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere


def test_parts_partition_the_stream_in_the_ratio_of_the_weights():
    train, valid, test = IterableWrapper(range(100)).random_split(
        {"train": 7, "valid": 2, "test": 1}, seed=3
    )
    parts = [list(train), list(valid), list(test)]
    assert [len(p) for p in parts] == [70, 20, 10] == [len(train), len(valid), len(test)]
    assert sorted(x for p in parts for x in p) == list(range(100))
    assert all(p == sorted(p) for p in parts)  # each keeps the stream's order


def test_the_split_depends_only_on_the_seed():
    def split(seed):
        return [list(p) for p in IterableWrapper(range(30)).random_split({"a": 1, "b": 2}, seed)]

    assert split(5) == split(5) != split(6)
    target = IterableWrapper(range(30)).random_split({"a": 1, "b": 2}, seed=5, target="b")
    assert isinstance(target, SplitPart) and list(target) == split(5)[1]


def test_the_same_split_in_every_epoch_and_loader_seed():
    train, _ = IterableWrapper(range(20)).shuffle(seed=1).random_split({"t": 1, "v": 1}, seed=0)
    with DataLoader(train, seed=11) as loader:
        first = list(loader)
    with DataLoader(train, seed=99) as loader:
        assert list(loader) == first  # same shuffle seed and split seed


def test_lengths_only_when_the_weights_scale_to_whole_items():
    a, b = IterableWrapper(range(10)).random_split({"a": 0.5, "b": 0.5}, seed=0)
    assert (len(a), len(b)) == (5, 5)
    odd, _ = IterableWrapper(range(10)).random_split({"a": 1, "b": 2}, seed=0)
    with pytest.raises(TypeError, match=r"not known in advance.*set_length"):
        len(odd)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 60), weights=st.lists(st.integers(1, 5), min_size=1, max_size=4))
@example(n=48, weights=[2, 1, 1, 3])  # the last draw overfilled a part when the others were full
def test_every_item_goes_to_exactly_one_part(n, weights):
    parts = IterableWrapper(range(n)).random_split(dict(enumerate(weights)), seed=n)
    assert sorted(x for part in parts for x in part) == list(range(n))


def test_errors_say_what_is_wrong():
    source = IterableWrapper(range(4))
    with pytest.raises(TypeError, match="seed must be an int, got None.*leaks into validation"):
        source.random_split({"a": 1}, seed=None)
    with pytest.raises(ValueError, match="weights must be a non-empty dict"):
        source.random_split({}, seed=0)
    with pytest.raises(ValueError, match="the weight of part 'a' must be a number > 0"):
        source.random_split({"a": 0}, seed=0)
    with pytest.raises(ValueError, match=r"target='c' is not one of the parts \['a', 'b'\]"):
        source.random_split({"a": 1, "b": 1}, seed=0, target="c")
    with pytest.raises(TypeError, match="needs total_length"):
        source.filter(lambda x: True).random_split({"a": 1}, seed=0)
    short, _ = source.random_split({"a": 1, "b": 1}, seed=0, total_length=2)
    with pytest.raises(ValueError, match="more than total_length=2 items"):
        list(short)


def test_repr():
    part = IterableWrapper(range(4)).random_split({"a": 1}, seed=0, target="a")
    assert repr(part) == "SplitPart(target='a', weights={'a': 1}, seed=0, total_length=4)"


def test_resume_from_every_step():
    check_resume_from_every_step(
        lambda: IterableWrapper(range(12)).random_split({"a": 1, "b": 1}, seed=2, target="b")
    )


def test_same_output_everywhere():
    def make():
        return (
            IterableWrapper(range(40))
            .random_split({"train": 3, "valid": 1}, seed=7, target="train")
            .shuffle()
            .sharding_filter()
        )

    epochs = check_same_output_everywhere(make)
    assert sorted(epochs[0]) == sorted(epochs[1]) and len(epochs[0]) == 30
