"""in_memory_cache(allow_random=True) over a random upstream: every epoch and every resume
gives each item exactly once, and a resume gives what the uninterrupted run gave.

A later pass reads the items the cache does not hold (those dropped by ``size``, or
those before a resume) from the upstream again; over a shuffle that read used to
come in the later epoch's order, so the epoch held some items twice and others
never.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, item_rng
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from tests.fuzzing.recipes import GeneratorSource  # draws from item_rng(), saves its place

N = 8


def big(x):
    return np.full(50_000, x, dtype=np.float64)  # 0.38 MiB


def jitter(x):
    return (x, int(item_rng().integers(1 << 30)))


def label(item):
    if isinstance(item, np.ndarray):
        return int(item[0])
    return item


def shuffled(size=None, draw=False):
    pipe = IterableWrapper(range(N)).shuffle().sharding_filter()
    pipe = pipe.map(jitter) if draw else pipe.map(big) if size else pipe
    return pipe.in_memory_cache(size=size, allow_random=True)


def epochs(loader, count):
    return [[label(item) for item in loader] for _ in range(count)]


@pytest.mark.parametrize("seed", [0, 1, None])
def test_a_cache_smaller_than_the_stream_replays_the_first_epoch_exactly(seed):
    # 1 MiB holds 2 of the 8 items: the other 6 are read again each epoch
    with DataLoader(shuffled(size=1), seed=seed) as loader:
        first, *later = epochs(loader, 3)
    assert sorted(first) == list(range(N))
    assert later == [first, first]


SERVICES = {
    "threads": lambda: ThreadReadingService(2),
    "persistent-processes": lambda: MultiProcessingReadingService(
        2, persistent_workers=True, timeout=30
    ),
}


def pairs(service):
    pipe = IterableWrapper(range(N)).sharding_filter().map(jitter).map(big_pair)
    # 1 MiB holds one pair: each worker (or the calling process) reads the others again
    with DataLoader(pipe.in_memory_cache(size=1, allow_random=True), service, seed=3) as loader:
        return [[(int(a[0]), int(b[0])) for a, b in loader] for _ in range(3)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("service", [None, *SERVICES])
def test_items_that_drew_upstream_replay_their_draws_for_the_part_read_again(service):
    first, *later = pairs(SERVICES[service]() if service else None)
    assert later == [first, first]
    if service:
        assert [first, *later] == pairs(None)


def big_pair(item):
    return big(item[0]), np.full(50_000, item[1], dtype=np.float64)


def drawn(size=None):
    return (
        IterableWrapper(range(N)).sharding_filter().map(jitter).in_memory_cache(allow_random=True)
    )


@pytest.mark.parametrize("epoch", [0, 1])
@pytest.mark.parametrize("build, size", [(shuffled, None), (shuffled, 1), (drawn, None)])
def test_a_resume_gives_the_rest_and_the_next_epochs_as_the_uninterrupted_run(epoch, build, size):
    with DataLoader(build(size), seed=5) as loader:
        expected = epochs(loader, 3)
    for stop in (1, 5, N):
        with DataLoader(build(size), seed=5) as loader:
            epochs(loader, epoch)
            iterator = iter(loader)
            head = [label(next(iterator)) for _ in range(stop)]
            state = loader.state_dict()
        with DataLoader(build(size), seed=5) as resumed:
            resumed.load_state_dict(state)
            rest = [label(item) for item in resumed]
            assert head + rest == expected[epoch], (epoch, stop)
            assert epochs(resumed, 2 - epoch) == expected[epoch + 1 :]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("service", list(SERVICES.values()), ids=list(SERVICES))
def test_workers_read_a_random_order_live_and_resume_each_item_exactly_once(service):
    # A worker resumed mid-epoch cannot tell which epoch its cache held, so over a random
    # upstream the workers' caches step aside: each epoch is the upstream's, live.
    with DataLoader(shuffled(), service(), seed=7) as loader:
        expected = epochs(loader, 3)
    assert all(sorted(epoch) == list(range(N)) for epoch in expected)
    with DataLoader(shuffled(), service(), seed=7) as loader:
        epochs(loader, 1)
        iterator = iter(loader)
        head = [label(next(iterator)) for _ in range(3)]
        state = loader.state_dict()
    with DataLoader(shuffled(), service(), seed=7) as resumed:
        resumed.load_state_dict(state)
        assert head + [label(item) for item in resumed] == expected[1]
        assert epochs(resumed, 1) == expected[2:]


def test_a_cache_over_a_random_fork_child_is_refused_with_the_reason():
    # Reading the first epoch again would restart the fork, and the other child with it.
    left, right = IterableWrapper(range(N)).shuffle().fork(2)
    pipe = left.in_memory_cache(allow_random=True).zip(right)
    with pytest.raises(ValueError, match="to read again, in a later epoch") as caught:
        DataLoader(pipe)
    assert "also read by" in str(caught.value)


def two_epochs(build, seed):
    """Two epochs of one loader over ``build()``: what a resume must give."""
    with DataLoader(build(), seed=seed) as loader:
        return [list(loader), list(loader)]


def stopped_and_resumed(build, seed, stop):
    """The epoch stopped after ``stop`` items and resumed by a fresh loader, and the next."""
    stopped = DataLoader(build(), seed=seed)
    epoch = iter(stopped)
    head = [next(epoch) for _ in range(stop)]
    state = stopped.state_dict()
    resumed = DataLoader(build(), seed=seed)
    resumed.load_state_dict(state)
    return head + list(resumed), list(resumed)


def test_a_state_saved_before_the_first_item_then_resumed_twice_replays_the_fill_epoch():
    # A resumed pass that loaded a state saved before the cache's first item filled
    # without noting its epoch; a state saved in it, resumed, then failed the next
    # epoch with an AssertionError (no fill epoch to replay the items before it).
    def build():
        return IterableWrapper(range(6)).shuffle().in_memory_cache(allow_random=True)

    expected = two_epochs(build, seed=0)
    first = DataLoader(build(), seed=0)
    iter(first)
    state = first.state_dict()  # the epoch started, the cache saw nothing yet
    second = DataLoader(build(), seed=0)
    second.load_state_dict(state)
    epoch = iter(second)
    assert [next(epoch) for _ in range(6)] == expected[0]
    state = second.state_dict()  # after the epoch's last item, before its end
    third = DataLoader(build(), seed=0)
    third.load_state_dict(state)
    assert list(third) == []
    assert list(third) == expected[1]


@pytest.mark.parametrize("stop", [0, 1, 2, 3])
def test_the_epoch_after_a_resume_draws_as_the_uninterrupted_one_after_the_cache(stop):
    # In the epoch after a resume the cache reads the items before the resume point by
    # replaying the fill epoch, and restamps them as the current epoch's, but only when
    # it had found them stamped by the sharding point's seed: it compared with a seed
    # that point had not drawn yet after a resume (its items all came from the saved
    # shuffle buffer), and it had nothing to compare with when the resume came after
    # the last item. Either way jitter() then drew the fill epoch's values again.
    def build():
        return (
            IterableWrapper(range(3))
            .sharding_filter()
            .shuffle(buffer_size=3)
            .in_memory_cache(allow_random=True)
            .map(jitter)
        )

    expected = two_epochs(build, seed=5)
    resumed_epoch, next_epoch = stopped_and_resumed(build, seed=5, stop=stop)
    assert resumed_epoch == expected[0]
    assert next_epoch == expected[1]


@pytest.mark.parametrize("drawn_in", ["source", "map_before_sharding", "prefetch_thread"])
@pytest.mark.parametrize("stop", [1, 2])
def test_draws_before_a_block_that_restamps_the_items_are_replayed_after_a_resume(drawn_in, stop):
    # The cache saw draws upstream only in the item's stamp, whose count a source or a
    # sharding point starts afresh; it took such items for non-random ones, and the epoch
    # after a resume read the items before the resume point live, with new draws.
    # A prefetch() hid them too: made in its thread, they did not count as the
    # consumer's (resume fuzzer, seed 751522).
    def build():
        if drawn_in == "map_before_sharding":
            pipe = IterableWrapper(range(3)).map(jitter).sharding_filter()
        else:
            pipe = GeneratorSource(3).sharding_filter()
        if drawn_in == "prefetch_thread":
            pipe = pipe.prefetch(2)
        return pipe.in_memory_cache(allow_random=True)

    expected = two_epochs(build, seed=7)
    assert expected[0] == expected[1]  # the cache replays the first epoch
    resumed_epoch, next_epoch = stopped_and_resumed(build, seed=7, stop=stop)
    assert resumed_epoch == expected[0]
    assert next_epoch == expected[1]


@pytest.mark.parametrize("prefetch", [False, True])
def test_draws_before_the_sharding_point_are_refused_without_allow_random(prefetch):
    pipe = IterableWrapper(range(3)).map(jitter).sharding_filter()
    pipe = (pipe.prefetch(2) if prefetch else pipe).in_memory_cache()
    with pytest.raises(RuntimeError, match="drew from item_rng"):
        list(DataLoader(pipe, seed=0))


def tagged(x):
    return x, item_rng().integers(1000)


@pytest.mark.parametrize("stop", [1, 3])
def test_a_threadpool_map_that_read_the_cache_to_its_end_resumes_into_the_replayed_epoch(stop):
    # threadpool_map reads ahead: the cache had reached its stream's end when the state
    # was saved, and the resumed threadpool_map never asked it again, so the cache never
    # completed, and the next epoch filled it afresh in that epoch's shuffle order.
    def build():
        return (
            IterableWrapper([0, 10, 20])
            .shuffle()
            .sharding_filter()
            .in_memory_cache(allow_random=True)
            .threadpool_map(tagged, max_workers=2)
        )

    expected = two_epochs(build, seed=1)
    resumed_epoch, next_epoch = stopped_and_resumed(build, seed=1, stop=stop)
    assert resumed_epoch == expected[0]
    assert next_epoch == expected[1]


@pytest.mark.parametrize("stop", [1, 4])
def test_a_state_saved_right_after_such_a_resume_still_says_the_cache_reached_its_end(stop):
    # A state saved after loading that state, before the next item, dropped "ended": the
    # resume from it never completed the cache, and the next epoch came in its own shuffle
    # order (found by scripts/fuzz_resume.py --modes stamps, seed 250063).
    def build():
        return (
            IterableWrapper(range(8))
            .shuffle(buffer_size=3)
            .sharding_filter()
            .in_memory_cache(allow_random=True)
            .threadpool_map(tagged, max_workers=1)
        )

    expected = two_epochs(build, seed=5)
    stopped = DataLoader(build(), seed=5)
    epoch = iter(stopped)
    head = [next(epoch) for _ in range(stop)]
    state = stopped.state_dict()
    stopped.shutdown()
    with DataLoader(build(), seed=5) as again:  # resumed and saved before its next item
        again.load_state_dict(state)
        iter(again)
        state = again.state_dict()
    with DataLoader(build(), seed=5) as resumed:
        resumed.load_state_dict(state)
        assert [head + list(resumed), list(resumed)] == expected


@pytest.mark.parametrize("stop", [1, 3])
def test_a_cycle_upstream_is_replayed_with_each_rounds_seeds(stop):
    # The cache kept the upstream's epoch seeds as drawn at the end of its fill, the last
    # round's under a cycle, and a replay of the fill epoch (the items before a resume
    # point) pinned every round to them: round 0's items came back with round 1's draws.
    def build():
        return GeneratorSource(2).cycle(2).sharding_filter().in_memory_cache(allow_random=True)

    expected = two_epochs(build, seed=3)
    assert expected[0] == expected[1]
    resumed_epoch, next_epoch = stopped_and_resumed(build, seed=3, stop=stop)
    assert resumed_epoch == expected[0]
    assert next_epoch == expected[1]
