"""A block's inputs: declared in ``inputs``, or found in its attributes when it declares none."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from pipeloom import DataLoader, graph
from pipeloom.datapipes import IterableWrapper, IterDataPipe, Mapper, seed_pipeline
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)


class Double(IterDataPipe):
    """Written as for torchdata: no ``inputs``, a source attribute, an ``__iter__``."""

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        for x in self.source:
            yield 2 * x


class Interleave(IterDataPipe):
    """No ``inputs``; its sources in a list."""

    def __init__(self, *sources):
        self.sources = list(sources)

    def __iter__(self):
        for items in zip(*self.sources):
            yield from items


class Named(IterDataPipe):
    """No ``inputs``; its sources in a dict."""

    def __init__(self, **sources):
        self.sources = sources

    def __iter__(self):
        for values in zip(*self.sources.values()):
            yield dict(zip(self.sources, values))


class Hiding(IterDataPipe):
    """Declares one input, keeps a second block beside it."""

    inputs = ("source",)

    def __init__(self, source, other):
        self.source = source
        self.other = other

    def __iter__(self):
        yield from zip(self.source, self.other)


def plus_one(x):
    return x + 1


def test_block_valued_attributes_are_the_inputs_of_a_block_that_declares_none():
    source = IterableWrapper(range(3))
    a, b = IterableWrapper("ab"), IterableWrapper("xy")
    assert Double(source).parents == (source,)
    assert Interleave(a, b).parents == (a, b)
    assert Named(left=a, right=b).parents == (a, b)
    assert [type(n).__name__ for n in graph.traverse(Double(source)).nodes] == [
        "Double",
        "IterableWrapper",
    ]


def test_reading_a_block_again_through_a_downstream_block_restarts_it():
    # Before: the second read gave [] because the restart walked declared inputs
    # only, so the exhausted source behind Double was never restarted.
    dp = Double(IterableWrapper(range(4)))
    assert list(dp) == [0, 2, 4, 6]
    assert list(dp.map(plus_one)) == [1, 3, 5, 7]
    assert list(Mapper(dp, plus_one)) == [1, 3, 5, 7]
    assert list(dp) == [0, 2, 4, 6]


def test_lists_and_dicts_of_blocks_restart_too():
    pipe = Interleave(IterableWrapper([1, 2]), IterableWrapper([3, 4]))
    assert list(pipe) == [1, 3, 2, 4]
    assert list(pipe.map(plus_one)) == [2, 4, 3, 5]
    named = Named(a=IterableWrapper([1]), b=IterableWrapper([2]))
    assert list(named) == [{"a": 1, "b": 2}]
    assert list(named.map(len)) == [2]


def test_a_long_list_that_holds_no_block_is_not_scanned_as_inputs():
    class Source(IterDataPipe):
        def __init__(self, names):
            self.names = names

        def __iter__(self):
            yield from self.names

    assert Source(["a"] * 100_000).parents == ()


def test_undeclared_inputs_are_seeded_like_declared_ones():
    a = Double(IterableWrapper(range(10)).shuffle())
    b = Double(IterableWrapper(range(10)).shuffle())
    seed_pipeline(a, 3)
    seed_pipeline(b, 3)
    assert list(a) == list(b) != sorted(list(a))


def test_graph_replace_rewires_an_undeclared_input():
    old, new = IterableWrapper([1]), IterableWrapper([5])
    pipe = Double(old)
    graph.replace(pipe, old, new)
    assert pipe.source is new and list(pipe) == [10]
    lists = Interleave(old, IterableWrapper([2]))
    graph.replace(lists, old, new)
    assert list(lists) == [5, 2]


def pipeline():
    return Double(IterableWrapper(range(12))).sharding_filter().map(plus_one).batch(3)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "make_service",
    [
        InProcessReadingService,
        lambda: ThreadReadingService(2),
        lambda: MultiProcessingReadingService(2),
        lambda: MultiProcessingReadingService(2, strategy="economic"),
        lambda: MultiProcessingReadingService(2, strategy="chunked"),
    ],
    ids=["in-process", "threads", "classic", "economic", "chunked"],
)
def test_a_torchdata_style_block_runs_unchanged_under_every_service(make_service):
    expected = [[2 * i + 1 for i in range(j, j + 3)] for j in range(0, 12, 3)]
    with DataLoader(pipeline(), make_service(), seed=0) as loader:
        assert list(loader) == expected
        assert list(loader) == expected  # a second epoch restarts the source behind it


def test_a_block_hiding_an_undeclared_block_is_refused_with_the_fix():
    pipe = Hiding(IterableWrapper([1]), IterableWrapper([2]))
    match = r"Hiding keeps the block IterableWrapper in attribute 'other' but its inputs"
    with pytest.raises(TypeError, match=match + r".*add 'other' to Hiding.inputs"):
        DataLoader(pipe)
    with pytest.raises(TypeError, match=match):  # read through a block: it would not restart
        list(pipe.map(plus_one))


def test_an_explicit_empty_inputs_is_taken_at_its_word():
    class Index(IterDataPipe):
        inputs = ()

        def __init__(self, of):
            self._of = [of]  # read for its length only

        def __iter__(self):
            yield from range(len(self._of[0]))

    pipe = Index(IterableWrapper([7, 8]))
    assert pipe.parents == () and list(pipe) == [0, 1]


_KEEPS_BLOCKS_FAST = """
import gc

from pipeloom import graph
from pipeloom.datapipes import IterableWrapper, reset_pipeline, seed_pipeline
from pipeloom.datapipes.runtime import check_declared_inputs
from tests.datapipes.test_inputs import Double, plus_one


def has_dict_object(block):
    referents = [r for r in gc.get_referents(block) if r is not type(block)]
    return len(referents) == 1 and type(referents[0]) is dict


pipe = Double(IterableWrapper(range(4))).map(plus_one).batch(2)
seed_pipeline(pipe, 0)
assert list(pipe) == [[1, 3], [5, 7]]
check_declared_inputs(pipe)
reset_pipeline(pipe)
graph.traverse(pipe)
print([type(b).__name__ for b in graph.traverse(pipe).nodes if has_dict_object(b)])
"""


@pytest.mark.timeout(60)
@pytest.mark.skipif(sys.version_info < (3, 11), reason="inline attribute values are CPython 3.11+")
def test_walking_and_checking_a_pipeline_keeps_its_blocks_fast():
    # vars(block) would turn a block's inline attributes into a dict object for
    # good, and every later self.x in its per-item code would get slower. In a
    # fresh interpreter: once instances of a class set their attributes in
    # different orders, CPython gives new ones a dict object anyway. (The
    # loader's fingerprint reads vars() at construction: not checked here.)
    root = str(pathlib.Path(__file__).parents[2])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-c", _KEEPS_BLOCKS_FAST],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
