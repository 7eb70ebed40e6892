"""A user who extends pipeloom with blocks of their own, written as the docs show
(docs/write_your_own_block.md, docs/custom_format.md), run under every reading service,
checkpointed and resumed: the items, their order and their ``item_rng()`` draws are the
in-process, uninterrupted epoch's, or a clear error says what to change."""

from __future__ import annotations

import threading

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import pipeloom
from pipeloom.datapipes import (
    IterableWrapper,
    IterDataPipe,
    MapDataPipe,
    MapToIter,
    current_position,
)
from pipeloom.errors import StateError
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from pipeloom.testing import collect
from tests.datapipes.helpers import Twice
from tests.reading_service.random_pipelines import (
    CustomShardable as Numbers,  # the docs' shardable source
)


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


def read_with_draw(path_and_file):
    _, file = path_and_file
    return file.read(), float(pipeloom.item_rng().random())


def test_open_files_after_the_workers_merge_keeps_the_sharding_points_draws(tmp_path):
    # open_files() is shardable too; after a shuffle it runs after the merge, where it
    # numbered the files again instead of keeping sharding_filter()'s positions.
    paths = []
    for i in range(6):
        (tmp_path / f"{i}.txt").write_text(str(i))
        paths.append(str(tmp_path / f"{i}.txt"))

    def make():
        pipe = IterableWrapper(paths).sharding_filter().shuffle().open_files()
        return pipe.map(read_with_draw).batch(2)

    assert epochs(make, ThreadReadingService(2)) == epochs(make)


# -- a generator block reading another generator block of yours ------------------------------


def test_a_generator_block_over_your_generator_source_stamps_each_item():
    # Plus read Numbers with `for x in self.source`, which ran Numbers' generator itself,
    # past the protocol: its items were not stamped, so item_rng() after them raised
    # "called outside a pipeline" (or drew from a stale item's key in a thread that had run
    # a pipeline before).
    out = epochs(lambda: Plus(Numbers(6)).map(with_position).map(noisy))[0]
    assert [item for item, _ in out] == [(100 + k, k) for k in range(6)]
    assert len({draw for _, draw in out}) == 6


class PlusTwice(Plus):
    """A subclass whose generator reads its parent class's generator."""

    def __iter__(self):
        for x in super().__iter__():
            yield x * 2


def test_a_subclass_generator_calling_super_iter_still_runs_its_parents_generator():
    out = epochs(lambda: PlusTwice(Numbers(4)).map(with_position))[0]
    assert out == [(200, 0), (202, 1), (204, 2), (206, 3)]


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


# -- a sharding point of yours that makes several items of one position ----------------------


class Records(IterDataPipe):
    """docs/custom_format.md's RecordReader in small: input ``n`` has ``n % 3 + 1`` records."""

    inputs = ("source",)
    stamps_positions = True

    def __init__(self, source):
        self.source, self.total, self.index = source, 1, 0
        self.reset()

    def is_shardable(self):
        return True

    def sharding_settings(self, total, index):
        self.total, self.index = total, index

    def reset(self):
        self.files, self.current, self.record, self.resume_from = 0, None, 0, 0

    def resume_at(self, position):
        self.resume_from = position

    def async_next(self):
        while True:
            if self.current is None:
                n = self.source.async_next()
                self.files += 1
                position = self.files - 1
                if position % self.total != self.index or position < self.resume_from:
                    continue
                self.current, self.record = n, 0
            if self.record == self.records_of(self.current):
                self.current = None
                continue
            self.record += 1
            self.stamp_position(self.files - 1, output=self.record - 1)
            return self.current, self.record - 1

    def records_of(self, n):
        return n % 3 + 1

    def state_dict(self):
        return {"files": self.files, "current": self.current, "record": self.record}

    def load_state_dict(self, state):
        self.files, self.current, self.record = state["files"], state["current"], state["record"]


def records():
    return Records(IterableWrapper(range(5))).map(noisy).batch(2)


class Counted(Records):
    """Records whose input ``v`` has ``v % 10`` records (none for a multiple of 10)."""

    def records_of(self, n):
        return n % 10


def copies(item):
    """None, two or four outputs of a record (a flatmap: several outputs of one chunk)."""
    (_, record), _ = item
    return [item] * (record % 3 * 2)


def several_records(counts, batch, fanned):
    def make():
        values = IterableWrapper([10 * i + count for i, count in enumerate(counts)])
        pipe = Counted(values).map(noisy)
        return (pipe.flatmap(copies) if fanned else pipe).batch(batch)

    return make


def persistent(n, **kwargs):
    return fork_service(n, persistent_workers=True, **kwargs)


# Where the main process reads the records: each way the dispatcher builds batches.
DISPATCHED = {
    "economic": lambda n: persistent(n, strategy="economic"),
    "economic+batch workers": lambda n: persistent(n, strategy="economic", num_batch_workers=1),
    "chunked": lambda n: persistent(n, strategy="chunked", chunk_size=1),
}
ELSEWHERE = {
    "classic": lambda n: persistent(n),
    "threads": ThreadReadingService,
    "in-process": lambda n: None,
}


def states_at_every_step(make, service):
    """The batches of an epoch under ``service`` and a checkpoint before each and after the last."""
    with pipeloom.DataLoader(make(), service, seed=0) as loader:
        iterator = iter(loader)
        states, seen = [loader.state_dict()], []
        for item in iterator:
            seen.append(item)
            states.append(loader.state_dict())
    return seen, states


def rests(make, service, states):
    """What one loader (its workers kept) yields after loading each of ``states``."""
    with pipeloom.DataLoader(make(), service, seed=1) as loader:
        found = []
        for state in states:
            loader.load_state_dict(state)
            found.append(list(loader))
    return found


@settings(max_examples=6, deadline=None, derandomize=True)
@example([3, 0, 2, 4], 2, "chunked", "in-process", (2, 3), True)  # outputs batched in main
@example([1, 4, 0, 3], 3, "economic", "classic", (2, 1), False)
@example([4, 1, 3], 2, "economic+batch workers", "threads", (1, 2), False)
@example([2, 3, 4], 3, "chunked", "classic", (3, 2), False)  # the first batch in chunks
@given(
    counts=st.lists(st.integers(0, 4), max_size=5),
    batch=st.integers(1, 3),
    way=st.sampled_from(sorted(DISPATCHED)),
    other=st.sampled_from(sorted(ELSEWHERE)),
    workers=st.sampled_from([(1, 2), (2, 1), (2, 3)]),
    fanned=st.booleans(),
)
def test_a_sharding_point_with_several_records_per_position_resumes_at_every_step(
    counts, batch, way, other, workers, fanned
):
    # economic and chunked resumed only at a position: a batch [(0, 0), (1, 0)] followed by
    # (1, 1) resumed at position 2 and lost (1, 1), so their checkpoints were refused.
    if fanned and way != "chunked":
        way = "chunked"  # economic refuses a flatmap before the batch
    make = several_records(counts, batch, fanned)
    expected = epochs(make)[0]
    ours, theirs = DISPATCHED[way], ELSEWHERE[other]
    seen, states = states_at_every_step(make, ours(workers[0]))
    assert seen == expected
    for resumed_under in (ours(workers[1]), theirs(workers[1])):
        for step, rest in enumerate(rests(make, resumed_under, states)):
            assert expected[:step] + rest == expected, (step, resumed_under)
    _, states = states_at_every_step(make, theirs(workers[0]))  # and back
    for step, rest in enumerate(rests(make, ours(workers[1]), states)):
        assert expected[:step] + rest == expected, step


def test_a_resumed_epoch_of_several_records_per_position_resumes_again_at_every_step():
    # The outputs a resume drops count as delivered: a second checkpoint inside the
    # same position resumes after them, not before.
    make = several_records([9, 5], 2, True)  # 18 outputs of 9 records, then 8 of 5
    expected = epochs(make)[0]
    assert len(expected) == 13

    def service(n):
        return persistent(n, strategy="chunked", chunk_size=2)  # up to 8 outputs a chunk

    _, states = states_at_every_step(make, service(2))
    with pipeloom.DataLoader(make(), service(2), seed=1) as loader:
        loader.load_state_dict(states[4])  # outputs 9 and 10 of the chunk of records 4, 5
        again = [loader.state_dict()]
        for _ in loader:
            again.append(loader.state_dict())
    for step, rest in enumerate(rests(make, service(1), again), start=4):
        assert expected[:step] + rest == expected, step


def test_a_state_of_the_dispatcher_from_before_taken_still_loads():
    # Saved before the dispatcher kept how many items of its position were taken ("taken").
    def make():
        return IterableWrapper(range(9)).sharding_filter().map(noisy).batch(2)

    expected = epochs(make)[0]
    _, states = states_at_every_step(make, DISPATCHED["economic"](2))
    state = states[2]
    dispatcher = state["service"]["tail"]["blocks"][-1]["state"]
    assert dispatcher.pop("taken") == 0
    assert rests(make, DISPATCHED["economic"](2), [state]) == [expected[2:]]


def test_a_state_taking_more_items_of_its_position_than_the_data_has_is_refused_on_resume():
    # The data changed (or the state was edited): dropping on would skip the next position.
    _, states = states_at_every_step(records, DISPATCHED["economic"](2))
    dispatchers = [s["service"]["tail"]["blocks"][-1]["state"] for s in states[1:-1]]
    index = next(i for i, d in enumerate(dispatchers) if d["taken"])
    dispatchers[index]["taken"] = 99
    with pytest.raises(StateError, match=r"after 99 of the items made there, but .* made only"):
        rests(records, DISPATCHED["economic"](2), [states[index + 1]])


@pytest.mark.parametrize("way", ["economic", "chunked"])
def test_a_state_taking_more_items_of_the_last_position_than_the_data_has_is_refused(way):
    # At the epoch's last position no next position shows the shortfall: the epoch
    # silently ended there, as though the state were right.
    _, states = states_at_every_step(records, DISPATCHED[way](1))
    state = states[-1]  # after the last batch: both records of position 4 taken
    dispatcher = state["service"]["tail"]["blocks"][-1]["state"]
    assert (dispatcher["position"], dispatcher["taken"]) == (4, 2)
    dispatcher["taken"] = 3
    with pytest.raises(StateError, match=r"after 3 of .* made only 2 there before the epoch ended"):
        rests(records, DISPATCHED[way](1), [state])


def plain():
    return IterableWrapper(range(11)).sharding_filter().map(noisy).batch(3)


@pytest.mark.parametrize("make", [records, plain])
@pytest.mark.parametrize(("saved", "loaded"), [("economic", "chunked"), ("chunked", "economic")])
def test_a_state_of_economic_resumes_under_chunked_and_back_at_every_step(make, saved, loaded):
    expected = epochs(make)[0]
    _, states = states_at_every_step(make, DISPATCHED[saved](2))
    assert rests(make, DISPATCHED[loaded](3), states) == [expected[i:] for i in range(len(states))]


def test_a_sharding_point_with_several_records_per_position_resumes_under_classic():
    expected = epochs(records)[0]
    seen, rest = resumed(records, 1, fork_service(2), ThreadReadingService(3))
    assert seen + rest == expected


def test_a_sharding_point_with_several_records_per_position_resumes_by_replay_under_economic():
    # Replay, which the refusal offered before they resumed exactly, still works.
    expected = epochs(records)[0]
    with pipeloom.DataLoader(
        records(), fork_service(2, strategy="economic"), seed=0, resume_by_replay=True
    ) as loader:
        iterator = iter(loader)
        seen = [next(iterator)]
        state = loader.state_dict()
    with pipeloom.DataLoader(
        records(), fork_service(2, strategy="economic"), seed=0, resume_by_replay=True
    ) as loader:
        loader.load_state_dict(state)
        assert seen + list(loader) == expected


# -- a block that holds a live object from __init__ ------------------------------------------


class Locked(IterDataPipe):
    """Holds a lock made in ``__init__`` (the docs say: make it in ``lazy_init``)."""

    inputs = ("source",)

    def __init__(self, source):
        self.source = source
        self.lock = threading.Lock()

    def __iter__(self):
        for x in self.source:
            with self.lock:
                yield x

    def state_dict(self):
        return {}


@pytest.mark.parametrize(
    "service", [lambda: ThreadReadingService(2), lambda: fork_service(2)], ids=["threads", "fork"]
)
def test_a_block_holding_a_lock_says_which_attribute_cannot_be_copied(service):
    # The reading service copies the pipeline for its workers and main process; the copy
    # failed with a bare "TypeError: cannot pickle '_thread.lock' object" from deepcopy.
    pipe = Locked(IterableWrapper(range(4)).sharding_filter())
    assert epochs(lambda: pipe) == [[0, 1, 2, 3]]  # in-process copies nothing
    with pytest.raises(
        TypeError, match=r"Locked\(\) cannot be copied.*attribute 'lock'.*lazy_init"
    ):
        epochs(lambda: Locked(IterableWrapper(range(4)).sharding_filter()), service())


# -- easy mistakes: a generator that raises StopIteration, an iterator kept across epochs ---


class StopsAtThree(IterDataPipe):
    """Ends its stream the torchdata way: ``raise StopIteration`` inside the generator."""

    inputs = ("source",)

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        for x in self.source:
            if x == 3:
                raise StopIteration
            yield x


def test_a_generator_that_raises_stop_iteration_is_told_to_return():
    # Python turns it into "RuntimeError: generator raised StopIteration", naming no block.
    with pytest.raises(RuntimeError, match=r"StopsAtThree.__iter__ raised StopIteration.*return"):
        epochs(lambda: Plus(StopsAtThree(IterableWrapper(range(6)))))


class KeepsItsIterator(IterDataPipe):
    """Makes the iterator of its input once and keeps it across epochs."""

    inputs = ("source",)

    def __init__(self, source):
        self.source = source
        self.iterator = None

    def __iter__(self):
        if self.iterator is None:
            self.iterator = iter(self.source)
        yield from self.iterator


def test_a_block_that_keeps_its_inputs_iterator_across_epochs_is_told_where_to_call_iter():
    with pytest.raises(RuntimeError, match=r"keeps an iterator of its input across epochs"):
        epochs(lambda: KeepsItsIterator(IterableWrapper(range(3))), n=2)


# -- any chain of your blocks resumes exactly, in another service -----------------------------


class Pairs(IterDataPipe):
    """The docs' Pairs: groups items two by two, keeping half a pair across calls."""

    inputs = ("source",)

    def __init__(self, source):
        self.source = source
        self._first = None

    def reset(self):
        self._first = None

    def async_next(self):
        if self._first is None:
            self._first = (self.source.async_next(),)
        second = self.source.async_next()
        (first,), self._first = self._first, None
        return (first, second)

    def state_dict(self):
        return {"first": self._first}

    def load_state_dict(self, state):
        self._first = state["first"]


STAGES = {"plus": Plus, "jitter": Jitter, "twice": Twice, "pairs": Pairs}


def tagged(x):
    return x if isinstance(x, int) else 0


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    size=st.integers(0, 9),
    stages=st.lists(st.sampled_from(sorted(STAGES)), max_size=3),
    after=st.integers(0, 10),
    records=st.booleans(),
)
def test_a_chain_of_your_blocks_resumes_in_threads_as_the_uninterrupted_epoch(
    size, stages, after, records
):
    def make():
        pipe = Records(IterableWrapper(range(size))) if records else Numbers(size)
        for name in stages:
            pipe = STAGES[name](pipe.map(tagged) if name == "plus" else pipe)
        return pipe.map(noisy)

    expected = epochs(make)[0]
    seen, rest = resumed(make, min(after, len(expected)), None, ThreadReadingService(2))
    assert seen + rest == expected


class ForgetsTheSecondRecord(Records):
    """Copies the template but misses stamp_position on one path (record 1 of a file)."""

    def stamp_position(self, position, output=None):
        if output != 1:
            super().stamp_position(position, output=output)


def test_a_stamps_positions_block_that_forgets_to_stamp_an_item_is_told_so():
    # The item kept the previous record's key: the same item_rng() draws, and under
    # workers it was merged before the records of the position it was given.
    with pytest.raises(ValueError, match=r"returned an item without calling self.stamp_position"):
        epochs(lambda: ForgetsTheSecondRecord(IterableWrapper(range(3))).map(noisy))


class RecordsByGenerator(IterDataPipe):
    """The same reader written as an ``__iter__`` generator (unsharded: in-process)."""

    inputs = ("source",)
    stamps_positions = True

    def __init__(self, source, forget=None, short=False):
        self.source, self.forget, self.short = source, forget, short

    def __iter__(self):
        for position, n in enumerate(self.source):
            for record in range(n % 3 + 1):
                if record != self.forget:  # short: p for record 0, (p, j) for the others
                    self.stamp_position(position, output=record or None if self.short else record)
                yield n, record, float(pipeloom.item_rng().random())

    def state_dict(self):
        return {}


def test_a_generator_block_that_stamps_positions_but_forgets_one_is_told_so():
    # GeneratorRun restamped the item as another output of the previous record: its own
    # item_rng() draws, but merged by the previous record's position, silently.
    for forget in (1, 2):  # a record after the previous record's stamp (after a pull: its key)
        with pytest.raises(ValueError, match=r"yielded an item without calling self.stamp_pos"):
            epochs(lambda f=forget: RecordsByGenerator(IterableWrapper(range(1, 4)), f).map(noisy))
    # Stamped every time (also with a draw between the stamp and the yield, or keys that
    # GeneratorRun would have given itself): the positions and draws as stamped.
    for short in (False, True):
        [items] = epochs(lambda s=short: RecordsByGenerator(IterableWrapper(range(3)), None, s))
        assert [item[:2] for item in items] == [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]


class SyntheticImages(IterDataPipe):
    """A source of the user's that makes random samples with ``item_rng()`` in ``__iter__``."""

    def __iter__(self):
        for index in range(9):
            yield index, int(pipeloom.item_rng().integers(1 << 30)), current_position()


@pytest.mark.parametrize("batched", [False, True])
def test_item_rng_in_a_source_of_your_own_draws_for_the_item_it_makes(batched):
    """Before, unbatched, every item raised 'item_rng() was called outside a pipeline';
    batched (a fused run), the draws were keyed by other items and differed by service."""

    def build():
        pipe = SyntheticImages().sharding_filter()
        return pipe.batch(2) if batched else pipe

    expected = collect(build(), seed=5)
    items = [i for batch in expected for i in batch] if batched else expected
    assert [index for index, _, _ in items] == list(range(9))
    assert [position for _, _, position in items] == list(range(9))  # keyed by its own item
    assert len({draw for _, draw, _ in items}) == 9
    for service in (ThreadReadingService(2), MultiProcessingReadingService(2)):
        with pipeloom.DataLoader(build(), service, seed=5) as loader:
            assert list(loader) == expected, service
