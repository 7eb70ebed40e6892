"""DistributedReadingService and SequentialReadingService.

The sharding arithmetic and the outer-sharding hook are tested in this
process; the ranks themselves run in spawned processes on 127.0.0.1 (gloo),
one launch per group of scenarios (see ``distributed_ranks.py``).
"""

from __future__ import annotations

import pytest
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.errors import DistributedError
from pipeloom.reading_service import (
    DistributedReadingService,
    InProcessReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
    ThreadReadingService,
)
from pipeloom.reading_service.distributed.rank_epoch import check_start
from pipeloom.reading_service.planning.sharding import keep_shard
from pipeloom.reading_service.strategies.classic.merge import next_owned_group
from tests.reading_service import distributed_ranks
from tests.reading_service.test_resume import resume_case

# -- sharding arithmetic (no processes) ------------------------------------------


@given(group=st.integers(0, 200), total=st.integers(1, 6), data=st.data())
def test_next_owned_group_is_the_first_group_of_the_shard(group, total, data):
    index = data.draw(st.integers(0, total - 1))
    expected = next(q for q in range(group, group + total) if q % total == index)
    assert next_owned_group(group, (total, index)) == expected


def _kept(length: int, total: int, index: int, group: int, outer=(1, 0)) -> list[int]:
    pipe = IterableWrapper(range(length)).sharding_filter()
    keep_shard(pipe, workers=total, index=index, group_size=group, outer=outer)
    return list(pipe)


@given(
    ranks=st.integers(1, 4),
    workers=st.integers(1, 3),
    group=st.integers(1, 4),
    length=st.integers(0, 40),
)
def test_workers_of_a_rank_split_exactly_the_rank_share(ranks, workers, group, length):
    seen: list[int] = []
    for rank in range(ranks):
        share = _kept(length, 1, 0, group, (ranks, rank))
        by_workers = [_kept(length, workers, i, group, (ranks, rank)) for i in range(workers)]
        assert sorted(x for kept in by_workers for x in kept) == share
        seen += share
    assert sorted(seen) == list(range(length))  # union = dataset, no overlap


def _outer(service, total: int, index: int):
    service.set_outer_sharding(total, index)
    return service


def _filtered_batches(n: int = 29):
    return (
        IterableWrapper(range(n))
        .shuffle()
        .sharding_filter()
        .filter(lambda x: x % 3 != 1)
        .map(lambda x: x * 2)
        .batch(3)
    )


@settings(max_examples=12, deadline=None)
@given(ranks=st.integers(1, 3), threads=st.integers(1, 3), data=st.data())
def test_threads_under_outer_sharding_give_the_in_process_shard(ranks, threads, data):
    rank = data.draw(st.integers(0, ranks - 1))
    service = _outer(ThreadReadingService(threads), ranks, rank)
    with DataLoader(_filtered_batches(), service, seed=0) as loader:
        got = list(loader)
    in_process = _outer(InProcessReadingService(), ranks, rank)
    assert got == list(DataLoader(_filtered_batches(), in_process, seed=0))


def test_processes_under_outer_sharding_give_the_in_process_shard():
    for rank in range(2):
        build = lambda: IterableWrapper(range(30)).sharding_filter().map(str).batch(4)  # noqa: E731
        expected = list(DataLoader(build(), _outer(InProcessReadingService(), 2, rank)))
        with DataLoader(build(), _outer(MultiProcessingReadingService(2), 2, rank)) as loader:
            assert list(loader) == expected
            assert len(loader) == len(expected) == 4


@pytest.mark.parametrize("strategy", ["economic", "chunked"])
def test_economic_and_chunked_under_outer_sharding_give_the_in_process_shard(strategy):
    def build():
        return IterableWrapper(range(30)).shuffle().sharding_filter().map(str).batch(4)

    for rank in range(2):
        expected = list(DataLoader(build(), _outer(InProcessReadingService(), 2, rank), seed=1))
        service = MultiProcessingReadingService(2, strategy=strategy, timeout=30)
        with DataLoader(build(), _outer(service, 2, rank), seed=1) as loader:
            assert list(loader) == expected
            assert len(loader) == len(expected)  # the rank's share, also before an epoch
    for stop in (0, 2):
        resume_case(
            build,
            lambda: _outer(MultiProcessingReadingService(3, strategy=strategy, timeout=30), 2, 1),
            stop=stop,
        )


@pytest.mark.parametrize("workers", [1, 3])
def test_outer_sharding_resumes_mid_epoch(workers):
    for stop in (0, 3):
        resume_case(
            _filtered_batches, lambda: _outer(ThreadReadingService(workers), 3, 2), stop=stop
        )


# -- the epoch's start: what the ranks must agree on --------------------------------


def test_start_check_picks_the_shortest_or_longest_length():
    rows = [[0, 5, 0, 0], [0, 7, 0, 0]]
    assert check_start(rows, uneven="shortest", end_check="auto") == 5
    assert check_start(rows, uneven="pad", end_check="auto") == 7
    assert check_start([[0, 5, 0, 0], [0, -1, 0, 0]], uneven="pad", end_check="auto") is None


def test_start_check_names_what_the_ranks_disagree_on():
    with pytest.raises(ValueError, match=r"different epochs \(0, 1, by rank\).*set_epoch"):
        check_start([[0, 5, 0, 0], [1, 5, 0, 0]], uneven="shortest", end_check="auto")
    with pytest.raises(ValueError, match=r"resume from different steps \(2, 3"):
        check_start([[0, 5, 2, 0], [0, 5, 3, 0]], uneven="shortest", end_check="auto")
    with pytest.raises(ValueError, match=r"end_check='length' needs len\(\).*rank\(s\) \[1\]"):
        check_start([[0, 5, 0, 0], [0, -1, 0, 0]], uneven="shortest", end_check="length")
    with pytest.raises(ValueError, match=r"1 of 2 ranks have an empty shard"):
        check_start([[0, 5, 0, 0], [0, 0, 0, 0]], uneven="pad", end_check="auto")
    with pytest.raises(DistributedError, match=r"rank\(s\) \[0\] failed to start"):
        check_start([[0, -1, 0, 1], [0, 0, 0, 0]], uneven="pad", end_check="auto")


# -- bad input and the one-rank case -------------------------------------------------


@pytest.fixture
def no_job(monkeypatch):
    assert not dist.is_initialized()
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_no_process_group_and_no_torchrun_environment_names_the_variables(no_job):
    no_job.setenv("MASTER_ADDR", "127.0.0.1")
    pipe = IterableWrapper(range(4)).sharding_filter()
    with pytest.raises(RuntimeError, match=r"lacks MASTER_PORT, RANK, WORLD_SIZE\. .*torchrun"):
        DataLoader(pipe, DistributedReadingService())


def test_world_size_one_is_a_no_op(no_job):
    no_job.setenv("WORLD_SIZE", "1")
    pipe = IterableWrapper(range(6)).shuffle()  # no sharding point needed for one rank
    expected = list(DataLoader(pipe, seed=4))
    service = SequentialReadingService(DistributedReadingService(), ThreadReadingService(2))
    with DataLoader(pipe, DistributedReadingService(), seed=4) as loader:
        assert list(loader) == expected
        assert (loader.reading_service.rank, loader.reading_service.world_size) == (0, 1)
    resume_case(lambda: IterableWrapper(range(9)).sharding_filter(), lambda: service, stop=0)
    resume_case(
        lambda: IterableWrapper(range(9)).sharding_filter().map(str),
        lambda: SequentialReadingService(DistributedReadingService(), ThreadReadingService(2)),
        stop=4,
    )
    assert "rank 0 of 1, main thread" in str(
        DataLoader(pipe, DistributedReadingService()).placement()
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"uneven": "drop"}, r"uneven must be one of 'shortest', 'pad', got 'drop'"),
        ({"end_check": "never"}, r"end_check must be one of .*got 'never'"),
        ({"timeout": 0}, r"timeout must be a number of seconds > 0 .*got 0"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DistributedReadingService(**kwargs)


def test_sequential_checks_its_services():
    with pytest.raises(ValueError, match="at least one service"):
        SequentialReadingService()
    with pytest.raises(TypeError, match="service 1 must be a ReadingService, got int"):
        SequentialReadingService(DistributedReadingService(), 4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"service 0 \(ThreadReadingService.*cannot run another"):
        SequentialReadingService(ThreadReadingService(2), DistributedReadingService())
    with pytest.raises(ValueError, match="cannot run inside another one"):
        SequentialReadingService(DistributedReadingService(), DistributedReadingService())
    composed = SequentialReadingService(DistributedReadingService(), ThreadReadingService(2))
    assert repr(composed) == (
        "SequentialReadingService(DistributedReadingService(uneven='shortest', "
        "end_check='auto', timeout=300, inner=ThreadReadingService(num_threads=2, "
        "prefetch_factor=2)), ThreadReadingService(num_threads=2, prefetch_factor=2))"
    )


# -- real ranks --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def launcher():
    """One launcher for the module's three launches: torch is imported once, not thrice."""
    with distributed_ranks.RankLauncher() as launcher:
        yield launcher


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, launcher):
    return distributed_ranks.launch(
        ["partition", "resume", "mismatched_epochs"],
        2,
        tmp_path_factory.mktemp("two"),
        launcher=launcher,
    )


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory, launcher):
    return distributed_ranks.launch(
        ["partition"], 3, tmp_path_factory.mktemp("three"), launcher=launcher
    )


def _ok(results: list) -> list:
    for rank, result in enumerate(results):
        assert isinstance(result, dict), f"rank {rank}: {result}"
    return results


def _check_partition(results: list, world: int) -> None:
    ranks = _ok(results)
    even, uneven = set(range(0, 60 * world, 10)), set(range(0, 10 * (6 * world + 1), 10))
    for case in ("in-process", "processes", "threads", "uneven", "pad", "pad-step"):
        seeds = {rank[case][0] for rank in ranks}
        assert len(seeds) == 1, f"{case}: the ranks did not agree on one seed"
        for epoch in range(2):
            shards = [rank[case][1][epoch] for rank in ranks]
            assert len({len(s) for s in shards}) == 1, f"{case}: counts differ: {shards}"
            union = {x for s in shards for x in s}
            if case in ("in-process", "processes", "threads"):
                assert sorted(x for s in shards for x in s) == sorted(even)  # partition
            elif case == "uneven":  # stop at the shortest: no repeats, one item short per rank
                assert sum(map(len, shards)) == len(union) and len(union) == 6 * world
            else:  # pad: every item at least once
                assert union == uneven and len(shards[0]) == 7
        if case in ("in-process", "processes", "threads"):
            epoch_0 = [rank[case][1][0] for rank in ranks]
            assert epoch_0 != [rank[case][1][1] for rank in ranks]  # reshuffled each epoch
    for rank in ranks:
        for same_items in rank["batched"][1:]:  # any service: the rank's batches are the same
            assert same_items == rank["batched"][0]
        for case in ("empty", "empty-step", "empty-processes"):
            assert rank[case][1] == [[], []]
        assert rank["empty-pad"][0] == "ValueError" and "empty shard" in rank["empty-pad"][1]
    for epoch in range(2):  # no len() (a filter): the ranks agreed at every step
        shards = [rank["uneven-step"][1][epoch] for rank in ranks]
        assert len({len(s) for s in shards}) == 1
        kept = [x for s in shards for x in s]
        assert len(set(kept)) == len(kept) and set(kept) <= set(range(0, 10 * 6 * world + 1, 20))
    batched = [x for rank in ranks for batch in rank["batched"][0][0] for x in batch]
    assert len(set(batched)) == len(batched) and set(batched) <= set(range(1, 31))
    if world == 2:  # 8 groups of 4 positions: 4 batches per rank, nothing dropped
        assert sorted(batched) == list(range(1, 31))


@pytest.mark.timeout(300)  # a hang detector; ranks start torch under spawn
def test_two_ranks_partition_the_data(two_ranks):
    _check_partition(two_ranks["partition"], 2)


@pytest.mark.timeout(300)  # a hang detector; ranks start torch under spawn
def test_three_ranks_partition_the_data(three_ranks):
    _check_partition(three_ranks["partition"], 3)


@pytest.mark.timeout(300)  # a hang detector; ranks start torch under spawn
def test_each_rank_resumes_mid_epoch_as_if_uninterrupted(two_ranks):
    for rank in _ok(two_ranks["resume"]):
        for case, (expected, resumed, following, after) in rank.items():
            assert resumed == expected, case
            assert after == following, case


@pytest.mark.timeout(300)  # a hang detector; ranks start torch under spawn
def test_ranks_on_different_epochs_fail_together(two_ranks):
    for kind, message in two_ranks["mismatched_epochs"]:
        assert kind == "ValueError" and "different epochs (0, 1, by rank)" in message


@pytest.mark.timeout(300)  # a hang detector; ranks start torch under spawn
def test_a_failing_rank_stops_the_others_within_the_timeout(tmp_path, launcher):
    results = distributed_ranks.launch(
        ["raises_on_one_rank", "stuck_rank", "crash_on_one_rank"],
        2,
        tmp_path,
        shared_event=True,
        launcher=launcher,
    )
    # Each message names its cause (not the loader's 10 s timeout): that is the promptness
    # asserted here, by cause rather than by wall clock (the machine may be loaded).
    (kind, message, _), (own_kind, own_message, _) = results["raises_on_one_rank"]
    assert (own_kind, own_message) == ("KeyError", "'bad sample on rank 1'")
    assert kind == "DistributedError" and "raised an error while loading" in message
    kind, message, _ = results["stuck_rank"][0]
    assert kind == "DistributedError" and "stopped iterating (waited at most 2 s" in message
    kind, message, _ = results["crash_on_one_rank"][0]
    assert kind == "DistributedError" and "another rank crashed" in message
    assert results["crash_on_one_rank"][1] == ("missing", 3)  # rank 1 died with os._exit(3)
