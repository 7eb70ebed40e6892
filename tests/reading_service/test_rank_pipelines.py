"""Every rank must read the same pipeline: ranks that built different ones all raise.

Ranks that differ in their data or their sharding (a stale mount listing 998
files of 1,000, a shuffle with another buffer, a missing ``sharding_filter``)
would otherwise read items twice or never, silently. The ranks are threads of
this process (``thread_ranks.py``): the service's own code and collectives.
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
from collections import Counter

import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import FileLister, IterableWrapper
from pipeloom.reading_service import (
    DistributedReadingService,
    ThreadReadingService,
    merge_rank_states,
)
from tests.reading_service.thread_ranks import ok, rank_service, run_ranks


def files(n: int = 1000):
    """A list of paths, shuffled before the sharding point, as a real job reads them."""
    return IterableWrapper([f"/data/{i:04d}.jpg" for i in range(n)])


def refusals(results: list) -> list[str]:
    """Every rank's message, asserting that each raised the ValueError."""
    for rank, result in enumerate(results):
        assert result[:2] == ("error", "ValueError"), f"rank {rank}: {result}"
    return [result[2] for result in results]


def first_items(pipelines, **service_args) -> list:
    """Each rank's loader over ``pipelines[rank]()``: its first two items, or its error."""

    def rank(world, index):
        service = rank_service(world, index, **service_args)
        with DataLoader(pipelines[index](), service, seed=0) as loader:
            return list(itertools.islice(iter(loader), 2))

    return run_ranks(len(pipelines), rank)


def test_a_rank_listing_fewer_files_makes_every_rank_raise_naming_it():
    def full():
        return files(1000).shuffle().sharding_filter().map(len)

    def stale():
        return files(998).shuffle().sharding_filter().map(len)

    messages = refusals(first_items([full, full, stale]))
    assert len(set(messages)) == 1  # the same error everywhere
    assert messages[0].startswith("the ranks' pipelines differ, so the sharding would neither")
    assert (
        "rank 2 differs from ranks 0, 1: block #3 IterableWrapper, field iterable: list of "
        "998 items on rank 2, list of 1000 items on ranks 0, 1\n" in messages[0]
    )
    assert messages[0].endswith(
        "pass DistributedReadingService(pipelines_may_differ=['IterableWrapper.iterable']) "
        "on every rank"
    )


def test_a_stale_mount_with_fewer_files_is_named_even_where_the_roots_may_differ(tmp_path):
    """Each host mounts the files under its own path (allowed); rank 1's mount lacks one."""
    for rank, count in enumerate([12, 11, 12]):
        (tmp_path / f"host{rank}").mkdir()
        for i in range(count):
            (tmp_path / f"host{rank}" / f"{i:02d}.jpg").write_text(str(i))

    def rank(world, index):
        pipe = FileLister(str(tmp_path / f"host{index}"), "*.jpg").shuffle().sharding_filter()
        service = rank_service(world, index, pipelines_may_differ=["FileLister.roots"])
        with DataLoader(pipe, service) as loader:
            return list(loader)

    message = refusals(run_ranks(3, rank))[0]
    assert (
        "rank 1 differs from ranks 0, 2: block #2 FileLister, field listed: 11 files on rank 1, "
        "12 files on ranks 0, 2\n" in message
    )
    assert "pipelines_may_differ=['FileLister.listed']" in message


@pytest.mark.parametrize(
    ("odd", "expected"),
    [
        (
            lambda: files().shuffle(buffer_size=100).sharding_filter().batch(4),
            "rank 1 differs from ranks 0, 2: block #2 Shuffler, field buffer_size: 100 on "
            "rank 1, 10000 on ranks 0, 2",
        ),
        (
            lambda: files().shuffle(seed=7).sharding_filter().batch(4),
            "rank 1 differs from ranks 0, 2: block #2 Shuffler, field seed: 7 on rank 1, None",
        ),
        (
            lambda: files().shuffle().sharding_filter().filter(bool).batch(4),
            "rank 1 differs from ranks 0, 2: block #1 is Filter on rank 1 but ShardingFilter "
            "on ranks 0, 2 (rank 1: 5 blocks, Batcher <- Filter <- ShardingFilter <- Shuffler "
            "<- IterableWrapper; ranks 0, 2: 4, Batcher <- ShardingFilter <- Shuffler <- "
            "IterableWrapper)",
        ),
    ],
    ids=["shuffle buffer", "shuffle seed", "another block"],
)
def test_the_first_differing_block_and_field_are_named(odd, expected):
    def usual():
        return files().shuffle().sharding_filter().batch(4)

    messages = refusals(first_items([usual, odd, usual]))
    assert expected in messages[0], messages[0]
    if "is Filter" in expected:
        assert "pipelines_may_differ=True) on every rank" in messages[0]  # no field to name


def test_the_largest_group_of_ranks_is_the_reference_and_every_other_group_is_named():
    pipelines = [lambda n=n: files(n).sharding_filter() for n in (9, 1000, 1000, 8)]
    message = refusals(first_items(pipelines))[1]
    assert "rank 0 differs from ranks 1, 2: block #1 IterableWrapper, field iterable: " in message
    assert "rank 3 differs from ranks 1, 2: block #1 IterableWrapper" in message


def test_what_may_differ_per_rank_does_not_stop_the_job():
    """Same code, same data: another worker count, prefetch depth, thread pool or device
    per rank, a pipeline reused by a second loader, and what the user allows."""

    def rank(world, index):
        pipe = (
            IterableWrapper(range(40))
            .shuffle()
            .sharding_filter()
            .map([abs, int, round][index])  # the same values: allowed below
            .filter(functools.partial(operator.le, -index))  # bound per rank, keeps all
            .threadpool_map(abs, max_workers=1 + index)
            .prefetch(2 + index)
            .to_device(f"cpu:{index}")
        )
        seen = []
        for workers in (1 + index, 2):  # the second loader finds the first one's shard settings
            service = rank_service(
                world,
                index,
                inner=lambda workers=workers: ThreadReadingService(workers),
                pipelines_may_differ=["Mapper.fn"],
            )
            with DataLoader(pipe, service, seed=0) as loader:
                seen.append(list(loader))
        return seen

    results = ok(run_ranks(3, rank))
    for loader in range(2):
        got = Counter(x for seen in results for x in seen[loader])
        assert max(got.values()) == 1 and len(got) >= 40 - 3


def test_the_ranks_compare_digests_in_the_exchange_they_make_anyway():
    """Matching pipelines cost no collective: the seed's broadcast, then one all-gather
    per epoch, as before the check."""

    def rank(world, index):
        with DataLoader(
            files(20).shuffle().sharding_filter(), rank_service(world, index)
        ) as loader:
            epochs = [list(loader) for _ in range(3)]
        return world.rounds(index), epochs

    results = ok(run_ranks(2, rank))
    assert [rounds for rounds, _ in results] == [4, 4]


def test_an_elastic_resume_compares_the_new_ranks_pipelines():
    """States loaded with strict=False (the same files under a new root) on 3 new ranks,
    one of which reads fewer files: every new rank refuses at the resumed epoch's start."""

    def save(world, index):
        pipe = files(30).shuffle().sharding_filter()
        with DataLoader(pipe, rank_service(world, index), seed=3) as loader:
            list(itertools.islice(iter(loader), 2))
            return merge_rank_states(world.exchange(index, loader.state_dict()))

    state = ok(run_ranks(2, save))[0]

    def resume(world, index):
        pipe = files(30 if index < 2 else 28).shuffle().sharding_filter()
        with DataLoader(pipe, rank_service(world, index)) as loader:
            loader.load_state_dict(state, strict=False)
            return list(loader)

    messages = refusals(run_ranks(3, resume))
    assert (
        "rank 2 differs from ranks 0, 1: block #2 IterableWrapper, field iterable: list of "
        in (messages[0])
    )


def test_ranks_allowing_different_differences_all_raise_saying_so():
    pipelines = [lambda: files().sharding_filter()] * 2

    def rank(world, index):
        allowed = [True, False][index]
        service = rank_service(world, index, pipelines_may_differ=allowed)
        with DataLoader(pipelines[index](), service) as loader:
            return list(loader)

    message = refusals(run_ranks(2, rank))[0]
    assert re.search(
        r"pipelines_may_differ=(True|False) on rank \d, (True|False) on rank \d", message
    )
    assert "(pass the same on every rank)" in message


def test_true_skips_the_check():
    pipelines = [lambda: files().sharding_filter(), lambda: files().shuffle().sharding_filter()]
    assert all(len(items) == 2 for items in ok(first_items(pipelines, pipelines_may_differ=True)))


@pytest.mark.parametrize("bad", ["FileLister.roots", ["roots"], [3], None])
def test_a_bad_pipelines_may_differ_is_refused_with_an_example(bad):
    with pytest.raises(ValueError, match=r"True, False or a list of 'Block\.field' names"):
        DistributedReadingService(pipelines_may_differ=bad)
    assert "pipelines_may_differ=('FileLister.roots',)" in repr(
        DistributedReadingService(pipelines_may_differ=["FileLister.roots"])
    )
