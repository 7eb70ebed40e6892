"""Placement planning: what runs in workers and what after the merge."""

from __future__ import annotations

import pytest

from pipeloom.datapipes import IterableWrapper, MapToIter, SequenceWrapper
from pipeloom.reading_service._plan import plan_workers


def names(blocks):
    return [type(b).__name__ for b in blocks]


def test_per_item_blocks_after_the_sharding_point_run_in_workers():
    pipe = IterableWrapper(range(10)).shuffle().sharding_filter().map(abs).filter(bool).shuffle()
    plan = plan_workers(pipe)
    assert names(plan.worker_blocks) == [
        "Filter",
        "Mapper",
        "ShardingFilter",
        "Shuffler",
        "IterableWrapper",
    ]
    assert type(plan.exit).__name__ == "Filter" and plan.group_size == 1


def test_batch_moves_into_workers_when_the_chain_is_one_to_one():
    pipe = IterableWrapper(range(10)).sharding_filter().map(abs).batch(4).collate()
    plan = plan_workers(pipe)
    assert type(plan.exit).__name__ == "Collator" and plan.group_size == 4


def test_batch_stays_in_main_after_a_filter():
    pipe = IterableWrapper(range(10)).sharding_filter().filter(bool).batch(4).collate()
    plan = plan_workers(pipe)
    assert type(plan.exit).__name__ == "Filter" and plan.group_size == 1


def test_batch_stays_in_main_when_asked():
    pipe = IterableWrapper(range(10)).sharding_filter().batch(4)
    assert plan_workers(pipe, batches_in_workers=False).group_size == 1


def test_map_style_pipelines_shard_by_index():
    plan = plan_workers(MapToIter(SequenceWrapper(list(range(5)))).map(abs))
    assert type(plan.exit).__name__ == "Mapper"


def test_no_sharding_point_is_explained():
    with pytest.raises(ValueError, match="no sharding point.*add .sharding_filter\\(\\)"):
        plan_workers(IterableWrapper(range(3)).map(abs))


def test_two_sharding_points_on_one_path_warn_which_one_splits():
    pipe = IterableWrapper(range(3)).sharding_filter().map(abs).sharding_filter()
    with pytest.warns(
        UserWarning, match="downstream of another sharding point.*only the upstream one splits"
    ):
        plan = plan_workers(pipe)
    assert type(plan.exit).__name__ == "ShardingFilter"


def test_independent_sharding_points_are_refused():
    left = IterableWrapper(range(3)).sharding_filter()
    right = IterableWrapper(range(3)).sharding_filter()
    with pytest.raises(ValueError, match="2 independent sharding points"):
        plan_workers(left.zip(right))


def test_placement_labels_workers_and_main():
    pipe = IterableWrapper(range(10)).sharding_filter().map(abs).shuffle()
    placement = plan_workers(pipe).placement("workers x2")
    assert placement.where(pipe) == "main process"
    assert "workers x2: Mapper" in str(placement)


def test_an_opener_after_a_sharding_filter_is_not_a_second_sharding_point():
    import warnings

    from pipeloom.datapipes import FileOpener

    pipe = FileOpener(IterableWrapper(["a", "b"]).sharding_filter()).map(abs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = plan_workers(pipe)
    assert type(plan.exit).__name__ == "Mapper"
