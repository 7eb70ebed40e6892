"""A user who extends pipeloom with blocks of their own, written as the docs show
(docs/write_your_own_block.md, docs/custom_format.md), run under every reading service,
checkpointed and resumed: the items, their order and their ``item_rng()`` draws are the
in-process, uninterrupted epoch's, or a clear error says what to change."""

from __future__ import annotations

import pytest

import pipeloom
from pipeloom.datapipes import MapDataPipe, MapToIter
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService


def noisy(x):
    return x, float(pipeloom.item_rng().random())


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
