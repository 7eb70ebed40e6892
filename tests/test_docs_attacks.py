"""What a user writes from the docs alone (docs/write_your_own_block.md, docs/custom_format.md)
and the mistakes they make reading them: each runs as the docs say, or fails with a message
that says what was expected, what was got and how to fix it."""

from __future__ import annotations

import pytest

import pipeloom
from pipeloom.datapipes import (
    IterableWrapper,
    IterDataPipe,
    MapDataPipe,
    MapToIter,
    SequenceWrapper,
)
from pipeloom.errors import StateError
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService


def noisy(x):
    return x, float(pipeloom.item_rng().random())


def fork_service(n, **kwargs):
    return MultiProcessingReadingService(n, start_method="fork", timeout=20, **kwargs)


# -- a map-style source of your own (docs: Squares, RecordDataset) ---------------------------


class Squares(MapDataPipe):
    """The docs' Squares: ``__getitem__`` and ``__len__``, an index built in ``lazy_init``."""

    def __init__(self, n):
        self.n = n

    def lazy_init(self):
        self.table = [i * i for i in range(self.n)]

    def __getitem__(self, index):
        return self.table[index]

    def __len__(self):
        return self.n


class AsyncSquares(Squares):
    """The RecordDataset shape: ``async_get`` instead of ``__getitem__``."""

    def async_get(self, index):
        return self.table[index]


@pytest.mark.parametrize("source", [Squares, AsyncSquares])
def test_item_rng_in_a_map_over_your_own_map_style_source_draws_from_the_index(source):
    def reference(batch_size):  # SequenceWrapper stamps each item with its index
        pipe = SequenceWrapper([i * i for i in range(6)]).map(noisy)
        return list(pipeloom.DataLoader(pipe.batch(batch_size) if batch_size else pipe, seed=0))

    assert list(pipeloom.DataLoader(source(6).map(noisy), seed=0)) == reference(0)
    batches = list(pipeloom.DataLoader(source(6).map(noisy).batch(2), seed=0))
    assert batches == reference(2)
    assert len({draw for batch in batches for _, draw in batch}) == 6  # none repeated
    with pipeloom.DataLoader(source(6).map(noisy), ThreadReadingService(2), seed=0) as loader:
        assert list(loader) == reference(0)


def test_your_own_map_style_source_resumes_under_processes_with_another_worker_count():
    def pipeline():
        return MapToIter(Squares(12).map(noisy)).batch(3)

    expected = list(pipeloom.DataLoader(pipeline(), seed=0))
    with pipeloom.DataLoader(pipeline(), fork_service(2, strategy="economic"), seed=0) as loader:
        iterator = iter(loader)
        seen = [next(iterator) for _ in range(2)]
        state = loader.state_dict()
    with pipeloom.DataLoader(pipeline(), fork_service(3, strategy="economic"), seed=0) as loader:
        loader.load_state_dict(state)
        assert seen + list(loader) == expected


def test_economic_explains_that_a_map_style_batch_is_not_the_batch_it_needs():
    pipe = Squares(6).map(noisy).batch(2)
    with pytest.raises(ValueError, match=r"called on a map-style block.*MapToIter\(dataset"):
        with pipeloom.DataLoader(pipe, fork_service(2, strategy="economic"), seed=0) as loader:
            list(loader)


# -- a block that turns one record into several items, written as a generator -----------------


def make_lines():
    """A fresh class each time: what a class was seen doing is remembered per class."""

    class Lines(IterDataPipe):
        inputs = ("source",)

        def __init__(self, source):
            self.source = source

        def __iter__(self):
            for n in self.source:
                for j in range(n):  # n records from input n
                    yield (n, j)

        def state_dict(self):
            return {}

    return Lines


def test_a_generator_making_several_items_per_input_refuses_a_state_it_cannot_resume():
    lines = make_lines()

    def pipeline():
        return lines(IterableWrapper([3, 1, 2]).sharding_filter()).batch(2)

    loader = pipeloom.DataLoader(pipeline(), seed=0)
    iterator = iter(loader)
    next(iterator)  # [(3, 0), (3, 1)]: inside input 3, which a restart would skip
    with pytest.raises(
        StateError,
        match=r"block #1 Lines\(\): its __iter__ generator .*"
        r"Write the block with async_next\(\).*resume_by_replay=True",
    ):
        loader.state_dict()
    replayed = pipeloom.DataLoader(pipeline(), seed=0, resume_by_replay=True)
    iterator = iter(replayed)
    seen = [next(iterator)]
    resumed = pipeloom.DataLoader(pipeline(), seed=0, resume_by_replay=True)
    resumed.load_state_dict(replayed.state_dict())
    assert seen + list(resumed) == list(pipeloom.DataLoader(pipeline(), seed=0))


def test_a_generator_with_one_item_per_input_still_checkpoints_with_an_empty_state():
    class Plus(IterDataPipe):
        inputs = ("source",)

        def __init__(self, source):
            self.source = source

        def __iter__(self):
            for x in self.source:
                if x % 3:
                    yield x + 100

        def state_dict(self):
            return {}

    def pipeline():
        return Plus(IterableWrapper(range(10))).batch(2)

    loader = pipeloom.DataLoader(pipeline(), seed=0)
    iterator = iter(loader)
    seen = [next(iterator)]
    resumed = pipeloom.DataLoader(pipeline(), seed=0)
    resumed.load_state_dict(loader.state_dict())
    assert seen + list(resumed) == list(pipeloom.DataLoader(pipeline(), seed=0))
