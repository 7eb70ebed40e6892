"""lazy_init runs once, before the first use of a block, wherever it runs."""

from __future__ import annotations

import copy
import pickle

import pytest

from pipeloom.datapipes import IterDataPipe, MapDataPipe, reset_pipeline
from tests.datapipes.helpers import OldStyleDouble


class CountingIter(IterDataPipe):
    def __init__(self):
        self.inits = 0

    def lazy_init(self):
        self.inits += 1
        self.data = [1, 2, 3]

    def __iter__(self):
        yield from self.data

    def __len__(self):
        return len(self.data)


class CountingMap(MapDataPipe):
    def __init__(self):
        self.inits = 0

    def lazy_init(self):
        self.inits += 1
        self.data = "abc"

    def __getitem__(self, index):
        return self.data[index]

    def __len__(self):
        return len(self.data)


@pytest.mark.parametrize(
    "first_use",
    [len, list, lambda p: next(iter(p)), lambda p: p.async_next()],
    ids=["len", "list", "iter", "async_next"],
)
def test_lazy_init_runs_once_before_any_first_use_of_an_iter_block(first_use):
    pipe = CountingIter()
    assert pipe.inits == 0
    first_use(pipe)
    first_use(pipe) if first_use is not list else list(pipe)
    len(pipe)
    assert pipe.inits == 1


@pytest.mark.parametrize(
    "first_use",
    [len, lambda p: p[0], lambda p: p.async_get(1), list],
    ids=["len", "getitem", "async_get", "list"],
)
def test_lazy_init_runs_once_before_any_first_use_of_a_map_block(first_use):
    pipe = CountingMap()
    first_use(pipe)
    assert pipe[2] == "c" and len(pipe) == 3
    assert pipe.inits == 1


def test_lazy_init_runs_when_the_framework_resets_the_pipeline():
    source = CountingIter()
    reset_pipeline(OldStyleDouble(source))
    assert source.inits == 1


def test_a_copy_sent_elsewhere_initializes_again_where_it_runs():
    pipe = CountingIter()
    list(pipe)
    for clone in (pickle.loads(pickle.dumps(pipe)), copy.deepcopy(pipe)):
        assert clone.inits == 1  # the count travelled, the "initialized" flag did not
        assert list(clone) == [1, 2, 3]
        assert clone.inits == 2


def test_lazy_init_failure_is_retried_on_next_use():
    class FailsOnce(IterDataPipe):
        attempts = 0

        def lazy_init(self):
            type(self).attempts += 1
            if type(self).attempts == 1:
                raise OSError("storage not mounted yet")

        def __iter__(self):
            yield 1

    pipe = FailsOnce()
    with pytest.raises(OSError, match="not mounted"):
        list(pipe)
    assert list(pipe) == [1]
