"""A user who extends pipeloom with blocks of their own, written as the docs show
(docs/write_your_own_block.md, docs/custom_format.md), run under every reading service,
checkpointed and resumed: the items, their order and their ``item_rng()`` draws are the
in-process, uninterrupted epoch's, or a clear error says what to change."""

from __future__ import annotations

import pytest

import pipeloom
from pipeloom.datapipes import IterDataPipe, MapDataPipe, MapToIter, current_position
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService


def noisy(x):
    return x, float(pipeloom.item_rng().random())


def with_position(x):
    return x, current_position()


def fork_service(n, **kwargs):
    return MultiProcessingReadingService(n, start_method="fork", timeout=20, **kwargs)


def epochs(make, service=None, n=1):
    with pipeloom.DataLoader(make(), service, seed=0) as loader:
        return [list(loader) for _ in range(n)]


def resumed(make, after, saved=None, loaded=None):
    """The items before a checkpoint taken after ``after`` items and the items after it."""
    with pipeloom.DataLoader(make(), saved, seed=0) as loader:
        iterator = iter(loader)
        seen = [next(iterator) for _ in range(after)]
        state = loader.state_dict()
    with pipeloom.DataLoader(make(), loaded, seed=1) as loader:
        loader.load_state_dict(state)
        return seen, list(loader)


# -- blocks as the docs write them ----------------------------------------------------------


class Squares(MapDataPipe):
    """The docs' map-style source: an index built in ``lazy_init``."""

    def __init__(self, n):
        self.n = n

    def lazy_init(self):
        self.table = [i * i for i in range(self.n)]

    def __getitem__(self, index):
        return self.table[index]

    def __len__(self):
        return self.n

    def state_dict(self):
        return {}


class Numbers(IterDataPipe):
    """The docs' shardable source: a generator that keeps every ``total``-th number."""

    def __init__(self, size):
        self.size, self.total, self.index = size, 1, 0

    def is_shardable(self):
        return True

    def sharding_settings(self, total, index):
        self.total, self.index = total, index

    def __iter__(self):
        yield from range(self.index, self.size, self.total)

    def state_dict(self):
        return {}


class Jitter(IterDataPipe):
    """A per-item generator block that draws from ``item_rng()`` for each input."""

    inputs = ("source",)
    per_item = True
    one_to_one = True

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        for x in self.source:
            yield x, float(pipeloom.item_rng().random())

    def state_dict(self):
        return {}


class Plus(IterDataPipe):
    """A generator transform, one output per input (its ``{}`` state is right)."""

    inputs = ("source",)

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        for x in self.source:
            yield x + 100

    def state_dict(self):
        return {}


# -- a redundant sharding_filter() after a map-style source of your own ----------------------


@pytest.mark.filterwarnings("ignore:.*is downstream of another sharding point")
def test_a_sharding_filter_after_your_map_style_source_keeps_its_draws_in_workers():
    # MapToIter is the sharding point; the sharding_filter after the shuffle passes every
    # item through (a warning says so). In-process it kept the source's index stamps; after
    # the workers' merge it numbered the merged stream again, so every map(fn) after it drew
    # other item_rng() values under threads and processes.
    def make():
        return MapToIter(Squares(8)).shuffle().sharding_filter().map(noisy).batch(3)

    expected = epochs(make, n=2)
    assert epochs(make, ThreadReadingService(2), n=2) == expected
    assert epochs(make, fork_service(2), n=1) == expected[:1]
    seen, rest = resumed(make, 1, ThreadReadingService(2), fork_service(3))
    assert seen + rest == expected[0]


# -- a generator block reading another generator block of yours ------------------------------


def test_a_generator_block_over_your_generator_source_stamps_each_item():
    # Plus read Numbers with `for x in self.source`, which ran Numbers' generator itself,
    # past the protocol: its items were not stamped, so item_rng() after them raised
    # "called outside a pipeline" (or drew from a stale item's key in a thread that had run
    # a pipeline before).
    out = epochs(lambda: Plus(Numbers(6)).map(with_position).map(noisy))[0]
    assert [item for item, _ in out] == [(100 + k, k) for k in range(6)]
    assert len({draw for _, draw in out}) == 6


def test_a_per_item_generator_block_over_your_shardable_source_draws_the_same_everywhere():
    def make():
        return Jitter(Numbers(9)).batch(2)

    expected = epochs(make, n=2)
    assert len({draw for batch in expected[0] for _, draw in batch}) == 9
    assert epochs(make, ThreadReadingService(2), n=2) == expected
    assert epochs(make, fork_service(2), n=1) == expected[:1]


def test_a_generator_block_over_your_generator_source_resumes_without_repeating():
    # Numbers' place was never counted (its generator ran outside the protocol), so a
    # checkpoint was refused, blaming Plus for outputs it made "without pulling an input".
    def make():
        return Plus(Numbers(6))

    seen, rest = resumed(make, 2)
    assert (seen, rest) == ([100, 101], [102, 103, 104, 105])
