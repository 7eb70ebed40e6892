"""ShardExpander (shard_expand): brace patterns into shard names."""

from __future__ import annotations

import pytest

from pipeloom.datapipes import IterableWrapper, ShardExpander
from pipeloom.datapipes._shard_expand import expand_shards
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere


def test_expands_ranges_with_and_without_padding():
    assert list(IterableWrapper(["ds-{00..05}.tar"]).shard_expand()) == [
        f"ds-{i:02d}.tar" for i in range(6)
    ]
    assert expand_shards("s{8..11}") == ["s8", "s9", "s10", "s11"]
    assert expand_shards("x{0..2}") == ["x0", "x1", "x2"]
    assert expand_shards("plain.tar") == ["plain.tar"]
    assert list(IterableWrapper(["imgs_{0..1}", "labels_{0..1}"]).shard_expand()) == [
        "imgs_0",
        "imgs_1",
        "labels_0",
        "labels_1",
    ]


def test_several_ranges_vary_the_last_fastest():
    assert expand_shards("{1..2}/{00..01}") == ["1/00", "1/01", "2/00", "2/01"]


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("a{3..3}", r"the range \{3\.\.3\} in 'a\{3\.\.3\}' is empty"),
        ("a{05..2}", "the low bound '05' is wider than the high bound '2'"),
        ("a{05..100}", "the zero-padded low bound '05' is shorter than '100'.*005"),
    ],
)
def test_bad_ranges_are_explained(pattern, message):
    with pytest.raises(ValueError, match=message):
        expand_shards(pattern)


def test_non_strings_are_rejected_and_repr():
    with pytest.raises(TypeError, match="expects str patterns"):
        list(IterableWrapper([3]).shard_expand())
    assert repr(ShardExpander(IterableWrapper([]))) == "ShardExpander()"


def test_resume_from_every_step():
    check_resume_from_every_step(
        lambda: IterableWrapper(["a{0..2}", "b", "c{1..2}"]).shard_expand()
    )


def test_same_output_everywhere():
    epochs = check_same_output_everywhere(
        lambda: IterableWrapper(["a{0..3}", "b{00..02}", "c"]).sharding_filter().shard_expand()
    )
    assert epochs[0] == ["a0", "a1", "a2", "a3", "b00", "b01", "b02", "c"]
