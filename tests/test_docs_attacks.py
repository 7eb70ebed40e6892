"""What a user writes from the docs alone (docs/write_your_own_block.md, docs/custom_format.md)
and the mistakes they make reading them: each runs as the docs say, or fails with a message
that says what was expected, what was got and how to fix it."""

from __future__ import annotations

import inspect
import itertools
import pathlib
import threading

import pytest

import pipeloom
from pipeloom import compat, reading_service
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


# -- mistakes a reader of the docs makes ---------------------------------------------------


def test_a_shardable_block_without_sharding_settings_is_refused_not_read_by_every_worker():
    class Numbers(IterDataPipe):
        def is_shardable(self):
            return True

        def __iter__(self):
            yield from range(6)

        def state_dict(self):
            return {}

    with pytest.raises(
        TypeError,
        match=r"Numbers.is_shardable\(\) returns True but Numbers does "
        r"not implement sharding_settings\(total, index\), so each worker",
    ):
        pipeloom.DataLoader(Numbers(), ThreadReadingService(2))


def test_inputs_naming_an_attribute_the_block_never_set_says_which_and_how_to_fix():
    class Reader(IterDataPipe):
        inputs = ("source",)

        def __init__(self, datapipe):
            self.datapipe = datapipe  # the docs say self.source

        def __iter__(self):
            yield from self.datapipe

    with pytest.raises(
        AttributeError,
        match=r"Reader.inputs = \('source',\) names 'source', but "
        r"this Reader has no attribute 'source'.*set self.source",
    ):
        pipeloom.DataLoader(Reader(IterableWrapper([1])))


def test_an_iter_that_returns_a_list_says_to_write_a_generator():
    class Listed(IterDataPipe):
        inputs = ("source",)

        def __init__(self, source):
            self.source = source

        def __iter__(self):
            return [x for x in self.source]

    with pytest.raises(TypeError, match="Listed.__iter__ must return an iterator, got list; "):
        list(pipeloom.DataLoader(Listed(IterableWrapper([1])).map(str)))


def test_a_generator_source_for_worker_threads_says_to_pass_a_reiterable():
    pipe = IterableWrapper(x for x in range(4)).sharding_filter()
    with pytest.raises(
        TypeError,
        match=r"one-shot iterator \(generator\), which cannot be copied "
        r"to worker threads.*pass a re-iterable object such as a list",
    ):
        with pipeloom.DataLoader(pipe, ThreadReadingService(2)) as loader:
            list(loader)
    # a one-shot iterator that can be copied is copied at its place (an endless source)
    pipe = IterableWrapper(itertools.count()).sharding_filter().header(6)
    with pipeloom.DataLoader(pipe, ThreadReadingService(2)) as loader:
        assert sorted(loader) == list(range(6))


def test_a_state_that_cannot_be_pickled_is_refused_naming_the_block_and_field():
    class Locked(IterDataPipe):
        inputs = ("source",)

        def __init__(self, source):
            self.source = source
            self.lock = threading.Lock()

        def __iter__(self):
            yield from self.source

        def state_dict(self):
            return {"count": 1, "lock": self.lock}

        def load_state_dict(self, state):
            pass

    loader = pipeloom.DataLoader(Locked(IterableWrapper(range(3))), seed=0)
    next(iter(loader))
    with pytest.raises(
        StateError,
        match=r"block #0 Locked\(\): state_dict\(\) returned a state "
        r"that cannot be pickled .*its field 'lock' must hold plain values",
    ):
        loader.state_dict()


def test_load_state_dict_strict_must_be_a_bool():
    loader = pipeloom.DataLoader(IterableWrapper(range(3)), seed=0)
    with pytest.raises(TypeError, match="strict must be a bool, got str 'no'; pass True or False"):
        loader.load_state_dict(loader.state_dict(), strict="no")  # type: ignore[arg-type]


# -- defaults the docs state, against the signatures -----------------------------------------

DOCUMENTED_DEFAULTS = [  # (page, the claim as written, object, parameter, default)
    ("distributed.md", '`"shortest"` (default)', "DistributedReadingService", "uneven", "shortest"),
    ("distributed.md", '`"auto"` (default)', "DistributedReadingService", "end_check", "auto"),
    (
        "distributed.md",
        "`timeout=` seconds (default 300)",
        "DistributedReadingService",
        "timeout",
        300,
    ),
    ("distributed.md", "`max_restarts` times (default\n3)", "RayReadingService", "max_restarts", 3),
    (
        "distributed.md",
        "`start_timeout` seconds (default 60)",
        "RayReadingService",
        "start_timeout",
        60,
    ),
    (
        "storage.md",
        "`max_member_size` bytes (default\n  4 GiB",
        "load_from_tar",
        "max_member_size",
        4 << 30,
    ),
    ("storage.md", "`timeout` seconds\n  (default 30)", "read_from_http", "timeout", 30),
    ("storage.md", "`retries` times in a row (default 3", "read_from_http", "retries", 3),
    ("storage.md", "`backoff` seconds (default 0.5", "read_from_http", "backoff", 0.5),
    ("storage.md", "`deadline` (default 600 seconds", "read_from_http", "deadline", 600),
    ("language_models.md", '`"first"` (default)', "mux", "stop", "first"),
    ("language_models.md", '`"split"` (default)', "pack", "oversized", "split"),
    (
        "reading_services.md",
        '`"classic"` (default)',
        "MultiProcessingReadingService",
        "strategy",
        "classic",
    ),
    ("compat.md", '`"process"` (default)', "compat.DataLoader", "worker_type", "process"),
]


@pytest.mark.parametrize(
    ("page", "claim", "owner", "parameter", "default"),
    DOCUMENTED_DEFAULTS,
    ids=[f"{owner}.{parameter}" for _, _, owner, parameter, _ in DOCUMENTED_DEFAULTS],
)
def test_a_default_the_docs_state_is_the_signatures(page, claim, owner, parameter, default):
    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / page).read_text()
    assert claim in text, f"{page} no longer says {claim!r}: update this table"
    where = {"compat.DataLoader": compat.DataLoader}
    found = (
        where.get(owner) or getattr(reading_service, owner, None) or getattr(IterDataPipe, owner)
    )
    assert inspect.signature(found).parameters[parameter].default == default
