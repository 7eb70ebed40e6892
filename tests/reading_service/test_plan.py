"""Planning: what runs in workers and what after the merge, as one printable Plan."""

from __future__ import annotations

import pytest

from pipeloom import DataLoader, graph
from pipeloom.datapipes import (
    FileOpener,
    IterableWrapper,
    IterDataPipe,
    MapToIter,
    SequenceWrapper,
)
from pipeloom.reading_service import (
    DistributedReadingService,
    InProcessReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
    ThreadReadingService,
)
from pipeloom.reading_service.planning.cut import cut_for_workers
from pipeloom.reading_service.planning.planner import Settings, make_plan


def names(blocks):
    return [type(b).__name__ for b in blocks]


# -- the cut ---------------------------------------------------------------------------


def test_per_item_blocks_after_the_sharding_point_run_in_workers():
    pipe = IterableWrapper(range(10)).shuffle().sharding_filter().map(abs).filter(bool).shuffle()
    cut = cut_for_workers(pipe)
    assert names(cut.worker_blocks) == [
        "Filter",
        "Mapper",
        "ShardingFilter",
        "Shuffler",
        "IterableWrapper",
    ]
    assert type(cut.exit).__name__ == "Filter" and cut.group_size == 1


def test_batch_moves_into_workers_when_the_chain_is_one_to_one():
    pipe = IterableWrapper(range(10)).sharding_filter().map(abs).batch(4).collate()
    cut = cut_for_workers(pipe)
    assert type(cut.exit).__name__ == "Collator" and cut.group_size == 4


def test_batch_stays_in_main_after_a_filter():
    pipe = IterableWrapper(range(10)).sharding_filter().filter(bool).batch(4).collate()
    cut = cut_for_workers(pipe)
    assert type(cut.exit).__name__ == "Filter" and cut.group_size == 1


def test_batch_stays_in_main_when_asked():
    pipe = IterableWrapper(range(10)).sharding_filter().batch(4)
    assert cut_for_workers(pipe, batches_in_workers=False).group_size == 1


def test_map_style_pipelines_shard_by_index():
    cut = cut_for_workers(MapToIter(SequenceWrapper(list(range(5)))).map(abs))
    assert type(cut.exit).__name__ == "Mapper"


def test_no_sharding_point_is_explained():
    with pytest.raises(ValueError, match="no sharding point.*add .sharding_filter\\(\\)"):
        cut_for_workers(IterableWrapper(range(3)).map(abs))


def test_two_sharding_points_on_one_path_warn_which_one_splits():
    pipe = IterableWrapper(range(3)).sharding_filter().map(abs).sharding_filter()
    with pytest.warns(
        UserWarning, match="downstream of another sharding point.*only the upstream one splits"
    ):
        cut = cut_for_workers(pipe)
    assert type(cut.exit).__name__ == "ShardingFilter"


def test_independent_sharding_points_are_refused():
    left = IterableWrapper(range(3)).sharding_filter()
    right = IterableWrapper(range(3)).sharding_filter()
    with pytest.raises(ValueError, match="2 independent sharding points"):
        cut_for_workers(left.zip(right))


def test_an_opener_after_a_sharding_filter_is_not_a_second_sharding_point():
    import warnings

    pipe = FileOpener(IterableWrapper(["a", "b"]).sharding_filter()).map(abs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cut = cut_for_workers(pipe)
    assert type(cut.exit).__name__ == "Mapper"


# -- traits, not types -------------------------------------------------------------------


class Pairs(IterDataPipe):
    """A custom block that declares it turns runs of 2 inputs into one output."""

    inputs = ("source",)

    def __init__(self, source):
        self.source = source

    def batches_of(self):
        return 2

    def __iter__(self):
        it = iter(self.source)
        for first in it:
            yield (first, next(it, None))


class EveryOther(IterDataPipe):
    """A custom sharding point that cannot deal out runs of positions."""

    inputs = ("source",)

    def __init__(self, source):
        self.source = source
        self.total, self.index = 1, 0

    def is_shardable(self):
        return True

    def sharding_settings(self, total, index):
        self.total, self.index = total, index

    def __iter__(self):
        for i, x in enumerate(self.source):
            if i % self.total == self.index:
                yield x


def test_a_custom_block_declaring_batches_of_is_built_in_workers():
    pipe = Pairs(IterableWrapper(range(6)).sharding_filter().map(abs))
    cut = cut_for_workers(pipe)
    assert cut.exit is pipe and cut.group_size == 2


def test_a_sharding_point_without_set_shard_group_size_deals_single_positions():
    point = EveryOther(IterableWrapper(range(6)))
    assert not point.can_shard_in_groups()
    assert IterableWrapper([1]).sharding_filter().can_shard_in_groups()
    cut = cut_for_workers(point.map(abs).batch(2))
    assert cut.group_size == 1 and type(cut.exit).__name__ == "Mapper"


# -- the plan ------------------------------------------------------------------------------


def side_stream() -> IterDataPipe:
    from tests.reading_service.test_separate import InOwnProcess

    side = InOwnProcess(IterableWrapper(range(8)).map(abs))
    return IterableWrapper(range(8)).sharding_filter().map(abs).zip(side).batch(2)


def test_the_plan_records_parts_sharding_point_and_queues():
    pipe = IterableWrapper(range(10)).sharding_filter().map(abs).shuffle()
    plan = make_plan(pipe, Settings("classic", workers=2, prefetch=3))
    assert plan.strategy == "classic" and plan.group_size == 1
    assert type(plan.sharding_point).__name__ == "ShardingFilter"
    assert [p.role for p in plan.parts] == ["main", "workers"]
    assert plan.part("workers").copies == 2 and plan.part("workers").exit is pipe.source
    assert plan.where(pipe) == "main process"
    (queue,) = plan.queues
    assert (queue.kind, queue.count, queue.capacity) == ("ProcessQueue", 2, 3)
    text = str(plan)
    assert "worker processes x2: Mapper" in text
    assert "strategy: classic" in text and "sharding point: ShardingFilter" in text
    assert "worker processes x2 -> main process: 2 ProcessQueue(capacity=3)" in text


def test_a_separate_process_block_is_placed_in_its_own_process_not_main():
    pipe = side_stream()
    plan = make_plan(pipe, Settings("classic", workers=2))
    marked = pipe.source.datapipes[1]
    assert plan.where(marked) == "separate process"
    assert plan.where(marked.source) == "separate process"  # what only it reads
    assert plan.where(pipe) == "main process"
    assert "separate process -> main process: 1 ProcessQueue" in str(plan)
    in_process = make_plan(pipe, Settings("in-process"))
    assert in_process.where(marked) == "main thread"  # the mark is ignored there


def test_economic_and_chunked_plans_name_their_units_and_workers():
    pipe = IterableWrapper(range(8)).sharding_filter().map(abs).batch(4).collate()
    economic = make_plan(pipe, Settings("economic", workers=3, batch_workers=2, prefetch=2))
    assert economic.unit == ("batch", 4, 2)
    assert [p.role for p in economic.parts] == ["main", "item workers", "batch workers"]
    assert economic.where(pipe.source.source) == "item worker processes x3"
    chunked = make_plan(pipe, Settings("chunked", workers=3, prefetch=2))
    assert chunked.unit == ("batch", 4, 2)  # whole batches to item workers, 2 in flight...
    assert chunked.first_unit_chunk == 2  # ...but the first in chunks: 4 over 3 workers
    assert chunked.where(pipe) == "item worker processes x3"
    assert "the first batch of an epoch: in chunks of 2 items" in str(chunked)
    filtered = IterableWrapper(range(8)).sharding_filter().filter(bool).batch(4).collate()
    chunked = make_plan(filtered, Settings("chunked", workers=3, prefetch=2))
    # A batch's items are unknown up front: chunks throughout (a batch over 3 workers), each
    # worker building the batches its chunk completes from the items relayed to it.
    assert chunked.unit == ("chunk", 2, 4)
    assert chunked.first_unit_chunk is None
    assert chunked.where(filtered) == "item worker processes x3"
    assert "9 ProcessQueue(capacity=4) of relayed items that do not fill a batch" in str(chunked)
    expanded = IterableWrapper(range(8)).sharding_filter().flatmap(lambda x: [x, x]).batch(4)
    chunked = make_plan(expanded, Settings("chunked", workers=3, prefetch=2))
    assert chunked.unit == ("chunk", 1, 8)  # may make several of one input: one per chunk
    assert chunked.where(expanded) == "item worker processes x3"
    opened = IterableWrapper(["a"]).sharding_filter().open_files("rb").map(len).batch(4)
    chunked = make_plan(opened, Settings("chunked", workers=2, prefetch=2))
    assert chunked.unit == ("batch", 4, 2)  # open_files below the sharding point: one per path
    assert chunked.first_unit_chunk == 2


def test_economic_without_batch_workers_gives_item_workers_whole_batches():
    pipe = IterableWrapper(range(8)).sharding_filter().map(abs).batch(4).collate()
    plan = make_plan(pipe, Settings("economic", workers=3, batch_workers=0, prefetch=2))
    assert plan.unit == ("batch", 4, 2)  # still 2 batches in flight, whatever the workers
    assert [p.role for p in plan.parts] == ["main", "item workers"]
    assert plan.where(pipe) == plan.where(pipe.source.source) == "item worker processes x3"
    assert "item worker processes x3 -> main process: 3 ProcessQueue" in str(plan)
    assert "builds and collates it" in str(plan)


def test_chunked_spreads_a_batch_over_no_more_workers_than_cores():
    pipe = IterableWrapper(range(8)).sharding_filter().map(abs).batch(8)
    four_cores = make_plan(pipe, Settings("chunked", workers=4, prefetch=2, cores=4))
    two_cores = make_plan(pipe, Settings("chunked", workers=4, prefetch=2, cores=2))
    assert four_cores.first_unit_chunk == 2
    assert two_cores.first_unit_chunk == 4
    assert four_cores.unit == two_cores.unit == ("batch", 8, 2)  # the same 16 items in flight
    assert two_cores.part("item workers").copies == 4


def test_loader_placement_is_the_plan_and_to_dot_draws_it():
    pipe = IterableWrapper(range(8)).sharding_filter().map(abs).shuffle()
    with DataLoader(pipe, ThreadReadingService(2), seed=0) as loader:
        plan = loader.placement()
    assert isinstance(plan, graph.Plan) and isinstance(plan, graph.Placement)
    dot = graph.to_dot(pipe, plan)
    assert dot == plan.to_dot()
    assert 'label="worker threads x2"' in dot and 'label="main thread"' in dot
    assert "penwidth=2" in dot  # the sharding point
    assert 'label="ThreadQueue"' in dot  # the edge from the workers to the main thread


def test_every_service_returns_a_plan_naming_its_strategy():
    pipe = IterableWrapper(range(8)).sharding_filter().map(abs).batch(2)
    services = {
        "in-process": InProcessReadingService(),
        "threads": ThreadReadingService(2),
        "classic": MultiProcessingReadingService(2),
    }
    for strategy, service in services.items():
        with DataLoader(pipe, service, seed=0) as loader:
            assert loader.placement().strategy == strategy


def test_a_rank_plan_names_the_rank_in_every_location(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")  # a job of one rank, without torch.distributed
    pipe = IterableWrapper(range(8)).sharding_filter().map(abs)
    service = SequentialReadingService(DistributedReadingService(), ThreadReadingService(2))
    with DataLoader(pipe, service, seed=0) as loader:
        plan = loader.placement()
    assert plan.rank == (0, 1)
    assert plan.where(pipe) == "rank 0 of 1, worker threads x2"
    assert all(link.source.startswith("rank 0 of 1, ") for link in plan.queues)
