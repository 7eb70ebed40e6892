"""Attacks on the blocks where one stream feeds several outputs, or one input several items.

``fork``, ``demux``, ``unzip``, ``round_robin_demux`` and ``random_split`` hand one
stream to several readers; ``flatmap``, ``unbatch`` and ``shuffled_flatmap`` make
several items of one input, keyed ``(p, j)``. ``docs/reading_services.md`` promises
the in-process items, order and ``item_rng()`` draws under every service;
``docs/checkpointing.md`` that a checkpoint resumes under another service and worker
count with exactly the rest of the epoch and the same next epoch. Each test checks
one of these where it once failed, or where no other test looked.
"""

from __future__ import annotations

import gc
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, IterDataPipe, SequenceWrapper, item_rng
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)
from tests.reading_service.random_pipelines import tar_shards

# -- steps (module level: worker processes use them) ---------------------------------


def jitter(x: Any) -> tuple[Any, int]:
    return (x, int(item_rng().integers(1000)))


def three(x: int) -> list[int]:
    return [x, x + 100, x + 200]


def pair(x: Any) -> list[Any]:
    return [x, x]


def negated(x: Any) -> tuple[Any, Any]:
    return (x, ("neg", x))


def parity(x: Any) -> int:
    return x[0] % 2 if isinstance(x, tuple) else x % 2


class Marked(IterDataPipe):
    """Passes its source through, in a process of its own (``is_separate_process``)."""

    inputs = ("source",)

    def __init__(self, source: IterDataPipe) -> None:
        self.source = source

    def is_separate_process(self) -> bool:
        return True

    def async_next(self) -> Any:
        return self.source.async_next()

    def state_dict(self) -> dict:
        return {}


# -- one stream read by two blocks -----------------------------------------------------


def _two_maps_over_one_source() -> IterDataPipe:
    source = IterableWrapper(range(6))
    return source.map(abs).zip(source.map(str))


def _a_source_concatenated_with_itself() -> IterDataPipe:
    source = IterableWrapper(range(6))
    return source.concat(source)


def _two_parts_of_one_random_split() -> IterDataPipe:
    train, valid = IterableWrapper(range(10)).random_split(weights={"a": 1, "b": 1}, seed=0)
    return train.concat(valid)


@pytest.mark.parametrize(
    "make",
    [_two_maps_over_one_source, _a_source_concatenated_with_itself, _two_parts_of_one_random_split],
)
def test_an_iterable_block_read_by_two_blocks_is_refused_instead_of_splitting_its_items(make):
    # Was: each reader took some of the items: the zip gave [(0, '1'), (2, '3'), (4, '5')],
    # the concat range(6) once, and the two parts of the split only the first part's
    # [2, 3, 5, 7, 8] (the second found the source ended), with no error.
    match = r"is read 2 times \(by .* and by .*\).* \.fork\(2\) it"
    with pytest.raises(ValueError, match=match):
        DataLoader(make())
    with pytest.raises(ValueError, match=match):
        list(make())


def test_a_fork_demux_or_map_style_block_may_still_have_several_readers():
    a, b = IterableWrapper(range(4)).fork(2)
    even, odd = IterableWrapper(range(4)).demux(2, parity)
    table = SequenceWrapper([10, 20, 30, 40])
    keys = IterableWrapper(range(4)).zip_with_map(table, abs).zip_with_map(table, _first)
    assert list(DataLoader(a.zip(b, even.zip_longest(odd), keys))) == [
        (0, 0, (0, 1), ((0, 10), 10)),
        (1, 1, (2, 3), ((1, 20), 20)),
    ]


def _first(x: tuple) -> int:
    return x[0]


# -- a fork shared between a separate process and the rest -------------------------


def _fork_split_across_a_separate_process() -> IterDataPipe:
    a, b = IterableWrapper(range(12)).fork(2, buffer_size=3)
    return IterableWrapper(range(12)).sharding_filter().zip(Marked(a.map(jitter)), b)


def _demux_split_across_a_separate_process() -> IterDataPipe:
    even, odd = IterableWrapper(range(12)).demux(2, parity, buffer_size=3)
    return IterableWrapper(range(6)).sharding_filter().zip(Marked(even), odd)


def _fork_split_across_two_separate_processes() -> IterDataPipe:
    a, b = IterableWrapper(range(12)).fork(2, buffer_size=3)
    return IterableWrapper(range(12)).sharding_filter().zip(Marked(a), Marked(b))


@pytest.mark.parametrize(
    "make",
    [
        _fork_split_across_a_separate_process,
        _demux_split_across_a_separate_process,
        _fork_split_across_two_separate_processes,
    ],
)
@pytest.mark.parametrize("service", ["threads", "classic"])
def test_a_fork_read_inside_and_outside_a_separate_process_is_refused_when_planned(make, service):
    # Was: the separate process ran its own copy of the fork, which filled with the items
    # of the child read elsewhere: "fork buffer of 3 items is full: child 1 is 3 items
    # behind child 0" from the separate process although the pipeline read both children
    # evenly (in-process it runs), and with a larger buffer every item was read twice.
    services = {
        "threads": lambda: ThreadReadingService(1),
        "classic": lambda: MultiProcessingReadingService(2, start_method="fork", timeout=20),
    }
    with pytest.raises(
        ValueError,
        match=r"Marked\(\) asks for a separate process, but _(Fork|Demux)Hub\(.*\) upstream of "
        r"it is also read outside that process \(by .*\).*Mark a block that reads every child",
    ):
        DataLoader(make(), services[service]())
    assert len(list(DataLoader(make()))) > 0  # in-process the mark is ignored: it runs


@pytest.mark.timeout(30)
def test_a_fork_wholly_inside_a_separate_process_gives_the_in_process_epochs():
    def make() -> IterDataPipe:
        a, b = IterableWrapper(range(8)).fork(2, buffer_size=2)
        side = Marked(a.zip(b.map(jitter)))
        return IterableWrapper(range(8)).sharding_filter().flatmap(pair).map(jitter).zip(side)

    expected = _epochs(make, InProcessReadingService())
    assert _epochs(make, ThreadReadingService(2)) == expected


# -- buffer errors name the function the user called ----------------------------------


def _unzip_read_one_child_first() -> IterDataPipe:
    first, second = IterableWrapper([(i, -i) for i in range(9)]).unzip(2, buffer_size=3)
    return first.concat(second).sharding_filter()


def _round_robin_read_one_child_first() -> IterDataPipe:
    first, second = IterableWrapper(range(9)).round_robin_demux(2, buffer_size=2)
    return second.concat(first).sharding_filter()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            _unzip_read_one_child_first,
            r"unzip buffer of 3 items is full: child 1 is 3 items behind child 0 .*; .* raise "
            r"buffer_size",
        ),
        (
            _round_robin_read_one_child_first,
            r"round_robin_demux buffer of 2 items is full: child 0 is 3 items behind child 1",
        ),
    ],
)
def test_a_full_buffer_names_the_block_the_user_wrote_also_from_a_worker(make, message):
    # Was: "fork buffer ..." for unzip and "demux buffer ..." for round_robin_demux.
    with pytest.raises(BufferError, match=message):
        list(make())
    with pytest.raises(BufferError, match=message + r"(.|\n)*raised in worker thread"):
        list(DataLoader(make(), ThreadReadingService(1)))


def _one_child_never_read() -> IterDataPipe:
    used, _unused = IterableWrapper(range(10)).sharding_filter().map(jitter).fork(2, buffer_size=4)
    return used.batch(2)


@pytest.mark.parametrize("service", ["in-process", "threads"])
def test_a_full_buffer_says_when_the_child_behind_has_read_nothing(service):
    # Was: "child 1 is 4 items behind child 0; consume the children more evenly", for a
    # child that nothing in the pipeline reads.
    services = {"in-process": InProcessReadingService, "threads": lambda: ThreadReadingService(2)}
    with pytest.raises(
        BufferError,
        match=r"fork buffer of 4 items is full: child 1 is 4 items behind child 0 \(child 1 has "
        r"read no item yet: if the pipeline never reads it, make only as many children",
    ):
        list(DataLoader(_one_child_never_read(), services[service]()))
    a, b = IterableWrapper(range(10)).fork(2, buffer_size=2)
    with pytest.raises(BufferError, match=r"behind child 0; consume"):  # b read one item
        list(b.header(1).concat(a))


# -- webdataset samples whose members the sharding point deals out ------------------


def _fields(sample: dict) -> tuple[str, list[str]]:
    return sample["__key__"], sorted(k for k in sample if not k.startswith("__"))


def _members_sharded_then_grouped() -> IterDataPipe:
    return IterableWrapper(tar_shards(9)).load_from_tar().sharding_filter().webdataset()


@pytest.mark.timeout(30)
def test_webdataset_groups_whole_samples_when_the_sharding_point_deals_out_tar_members():
    # Was: webdataset() ran in the workers, each grouping the members it was dealt:
    # 18 samples of one field, ('s0000', ['num']), ('s0000', ['txt']), ..., where the
    # in-process run gives 9 of two.
    def make() -> IterDataPipe:
        return _members_sharded_then_grouped().map(_fields)

    expected = _epochs(make, InProcessReadingService())
    assert [fields for _, fields in expected[0]] == [["num", "txt"]] * 9
    assert _epochs(make, ThreadReadingService(2)) == expected
    processes = MultiProcessingReadingService(2, start_method="fork", timeout=20)
    assert _epochs(make, processes) == expected
    with pytest.raises(
        ValueError,
        match=r"WebDataset\(\) cannot run in the workers here.*\.sharding_filter\(\) before "
        r"\.load_from_tar\(\)",
    ):
        DataLoader(make().batch(2), MultiProcessingReadingService(2, strategy="chunked"))
    # Shards dealt out whole: the workers still group their own shards' members.
    grouped = IterableWrapper(tar_shards(9)).sharding_filter().load_from_tar().webdataset()
    with DataLoader(grouped, ThreadReadingService(2)) as loader:
        assert loader.placement().where(grouped) == "worker threads x2"


# -- random pipelines with several outputs per stream or per input --------------------
#
# A recipe: (size, expander, splitter, tail). The expander runs in the workers on each
# item (several items per input, keyed (p, j)); the splitter hands the stream to
# several readers in the main process; every item draws from item_rng().

EXPANDERS = {
    "none": lambda p: p,
    "flatmap": lambda p: p.flatmap(three),
    "unbatch": lambda p: p.map(pair).unbatch(),
    "filter_flatmap": lambda p: p.filter(_not_multiple_of_four).flatmap(three),
}
SPLITTERS = {
    "none": lambda p: p,
    "fork_zip": lambda p: _zipped(p.fork(2)),
    "fork_concat": lambda p: _concatenated(p.fork(2)),
    "demux_zip_longest": lambda p: _zipped_longest(p.demux(2, parity)),
    "demux_concat": lambda p: _concatenated(p.demux(2, parity)[::-1]),
    "unzip_zip": lambda p: _zipped(p.map(negated).unzip(2)),
    "round_robin": lambda p: _zipped_longest(p.round_robin_demux(3)),
}
TAILS = {
    "none": lambda p: p,
    "batch": lambda p: p.batch(4),
    "shuffled_flatmap": lambda p: p.shuffled_flatmap(pair, buffer_size=3),
    "in_batch_shuffle": lambda p: p.batch(3).in_batch_shuffle(),
    "jitter_batch": lambda p: p.map(jitter).batch(2),
}


def _not_multiple_of_four(x: int) -> bool:
    return x % 4 != 0


def _zipped(children: list) -> IterDataPipe:
    return children[0].map(jitter).zip(*children[1:])


def _zipped_longest(children: list) -> IterDataPipe:
    return children[0].zip_longest(*[c.map(jitter) for c in children[1:]])


def _concatenated(children: list) -> IterDataPipe:
    return children[0].map(jitter).concat(*children[1:])


def build(recipe: tuple) -> IterDataPipe:
    size, expander, splitter, tail = recipe
    pipe = IterableWrapper(range(size)).shuffle().sharding_filter().map(jitter)
    pipe = EXPANDERS[expander](pipe.map(_first))
    return TAILS[tail](SPLITTERS[splitter](pipe))


recipes = st.tuples(
    st.integers(0, 10),
    st.sampled_from(sorted(EXPANDERS)),
    st.sampled_from(sorted(SPLITTERS)),
    st.sampled_from(sorted(TAILS)),
)


def _epochs(make: Callable[[], IterDataPipe], service: Any, seed: int = 5) -> list[list]:
    with DataLoader(make(), service, seed=seed) as loader:
        epochs = [list(loader), list(loader)]
    gc.collect()
    return epochs


def _resumed(make, saved: Any, resumed: Any, stop: int, seed: int = 5) -> tuple[list, list]:
    """The first ``stop`` items under ``saved``, then the rest and the next epoch resumed
    from a checkpoint in a fresh loader under ``resumed``."""
    with DataLoader(make(), saved, seed=seed) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(stop)]
        state = pickle.loads(pickle.dumps(loader.state_dict()))
    with DataLoader(make(), resumed, seed=seed + 1) as loader:
        loader.load_state_dict(state)
        rest, following = list(loader), list(loader)
    gc.collect()
    return head + rest, following


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    recipe=recipes,
    saved=st.integers(0, 3),
    resumed=st.integers(0, 3),
    stop=st.integers(0, 40),
)
def test_threads_give_and_resume_the_in_process_epochs_of_multi_output_pipelines(
    recipe, saved, resumed, stop
):
    expected = _epochs(lambda: build(recipe), InProcessReadingService())
    assert _epochs(lambda: build(recipe), ThreadReadingService(saved)) == expected
    stop = min(stop, len(expected[0]))
    epoch, following = _resumed(
        lambda: build(recipe), ThreadReadingService(saved), ThreadReadingService(resumed), stop
    )
    assert epoch == expected[0]
    assert following == expected[1]


@pytest.mark.timeout(60)
def test_processes_resume_a_multi_output_pipeline_under_another_strategy_and_worker_count():
    # Each split point of a flatmap's outputs, resumed from classic x2 into chunked x3 and
    # back: the rest of the epoch and the next one, with the same item_rng() draws.
    def make() -> IterDataPipe:
        return build((9, "filter_flatmap", "none", "jitter_batch"))

    def classic() -> MultiProcessingReadingService:
        return MultiProcessingReadingService(2, start_method="fork", timeout=20)

    def chunked() -> MultiProcessingReadingService:
        return MultiProcessingReadingService(3, strategy="chunked", start_method="fork", timeout=20)

    expected = _epochs(make, InProcessReadingService())
    for saved, resumed, stop in [(classic, chunked, 2), (chunked, classic, 5)]:
        assert _resumed(make, saved(), resumed(), stop) == (expected[0], expected[1])
