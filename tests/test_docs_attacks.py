"""What a user writes from the docs alone (docs/write_your_own_block.md, docs/custom_format.md)
and the mistakes they make reading them: each runs as the docs say, or fails with a message
that says what was expected, what was got and how to fix it."""

from __future__ import annotations

import pytest

import pipeloom
from pipeloom.datapipes import (
    MapDataPipe,
    MapToIter,
    SequenceWrapper,
)
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
