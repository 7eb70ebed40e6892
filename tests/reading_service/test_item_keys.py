"""Item keys: every output of a multi-output block has its own place in the draw sequence,
identical under every service, and checkpoints resume exactly (#13 items 1, 2, 3)."""

from __future__ import annotations

import io
import tarfile

import pytest

from pipeloom import DataLoader, item_rng
from pipeloom.datapipes import (
    FileLister,
    IterableWrapper,
    IterDataPipe,
    current_position,
    item_seed,
)
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from pipeloom.testing import check_resume_from_every_step

pytestmark = pytest.mark.timeout(120)

SHARDS, SAMPLES = 4, 25


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    """4 tar shards of 25 two-member samples (``.txt``, ``.cls``), numbered across shards."""
    root = tmp_path_factory.mktemp("shards")
    number = 0
    for shard in range(SHARDS):
        with tarfile.open(root / f"shard-{shard}.tar", "w") as tar:
            for _ in range(SAMPLES):
                for ext in ("txt", "cls"):
                    data = str(number).encode()
                    info = tarfile.TarInfo(f"s{number:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                number += 1
    return str(root)


def sample_draw(sample):
    return sample["__key__"], float(item_rng().random())


def member_draw(member):
    return member[0].rsplit("/", 1)[1], float(item_rng().random())


def samples(root, batch=4):
    pipe = FileLister(root, "shard-*.tar").shuffle().sharding_filter().open_files("rb")
    return pipe.load_from_tar().webdataset().map(sample_draw).batch(batch)


def members(root, batch=4):
    pipe = FileLister(root, "shard-*.tar").shuffle().sharding_filter().open_files("rb")
    return pipe.load_from_tar().map(member_draw).batch(batch)


SERVICES = {
    "in-process": lambda: None,
    "threads": lambda: ThreadReadingService(2),
    "classic": lambda: MultiProcessingReadingService(2, timeout=60),
    "classic-3": lambda: MultiProcessingReadingService(3, timeout=60),
    "chunked": lambda: MultiProcessingReadingService(2, strategy="chunked", timeout=60),
}


def run(build, service, seed=0):
    with DataLoader(build(), service, seed=seed) as loader:
        return list(loader)


@pytest.mark.parametrize("pipeline", [samples, members])
@pytest.mark.parametrize("name", list(SERVICES))
def test_tar_pipelines_resume_exactly_under_every_service(shard_dir, pipeline, name):
    # #13 item 1: chunked delivered 295 of 200 samples after such a resume.
    def build():
        return pipeline(shard_dir)

    expected = run(build, None)
    with DataLoader(build(), SERVICES[name](), seed=0) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(7)]
        state = loader.state_dict()
    with DataLoader(build(), SERVICES[name](), seed=0) as resumed:
        resumed.load_state_dict(state)
        assert head + list(resumed) == expected


@pytest.mark.parametrize("pipeline", [samples, members])
@pytest.mark.parametrize("name", [n for n in SERVICES if n != "in-process"])
def test_draws_after_tar_and_webdataset_are_distinct_and_the_same_everywhere(
    shard_dir, pipeline, name
):
    # #13 item 2: item_rng() after webdataset() repeated draws, and they changed per service.
    expected = run(lambda: pipeline(shard_dir), None)
    draws = [draw for batch in expected for _, draw in batch]
    assert len(draws) == len(set(draws)) > SAMPLES
    assert run(lambda: pipeline(shard_dir), SERVICES[name]()) == expected


def test_chunked_keeps_the_sharding_points_positions_below_a_shardable_opener(shard_dir):
    # Item workers restarted open_files' positions per chunk (0, 1, 0, 1, ...).
    def build():
        return FileLister(shard_dir, "*.tar").sharding_filter().open_files("rb").map(close_and_draw)

    def batched():
        return build().batch(2)

    expected = run(batched, None)
    assert [p for batch in expected for p, _ in batch] == list(range(SHARDS))
    service = MultiProcessingReadingService(2, strategy="chunked", timeout=60)
    assert run(batched, service) == expected


def close_and_draw(pair):
    pair[1].close()
    return current_position(), item_seed()


def test_unbatch_in_the_tail_does_not_repeat_an_item_after_a_resume():
    # Threads: the tail's unbatch held [13] while the merge said "position 13, nothing
    # delivered", so the worker built a new batch [13] and 13 came twice.
    def build():
        return IterableWrapper(range(14)).sharding_filter().batch(3).unbatch().batch(3).unbatch()

    for service in (lambda: ThreadReadingService(1), lambda: ThreadReadingService(2)):
        for stop in range(15):
            with DataLoader(build(), service(), seed=0) as loader:
                iterator = iter(loader)
                head = [next(iterator) for _ in range(stop)]
                state = loader.state_dict()
            with DataLoader(build(), service(), seed=0) as resumed:
                resumed.load_state_dict(state)
                assert head + list(resumed) == list(range(14)), stop


def test_outputs_of_one_input_have_their_own_keys_and_draws():
    def draw(x):
        return x, float(item_rng().random())

    pipe = IterableWrapper([[1, 2], [3]]).sharding_filter().unbatch().flatmap(lambda x: [x, x])
    out = list(DataLoader(pipe.map(draw), seed=0))
    assert [x for x, _ in out] == [1, 1, 2, 2, 3, 3]
    assert len({d for _, d in out}) == 6


# -- user-defined sources and sharding points (#13 item 3) -----------------------


class Numbers(IterDataPipe):
    """A plain ``__iter__`` source that shards itself, as docs/write_your_own_block.md shows."""

    def __init__(self, n):
        self.n, self.total, self.index = n, 1, 0

    def is_shardable(self):
        return True

    def sharding_settings(self, total, index):
        self.total, self.index = total, index

    def __iter__(self):
        yield from range(self.index, self.n, self.total)

    def state_dict(self):
        return {}


class Contiguous(Numbers):
    """Shards in contiguous runs: not round-robin, so the merged order is round-robin."""

    def __iter__(self):
        size = -(-self.n // self.total)
        yield from range(self.index * size, min(self.n, (self.index + 1) * size))


def number_draw(x):
    return x, float(item_rng().random())


def numbers():
    return Numbers(11).map(number_draw).batch(2)


CUSTOM_SERVICES = {
    "in-process": lambda: None,  # its state is {}: it resumes by re-making and dropping
    **{f"threads-{n}": (lambda n=n: ThreadReadingService(n)) for n in (1, 2, 3)},
    **{f"classic-{n}": (lambda n=n: MultiProcessingReadingService(n, timeout=60)) for n in (1, 3)},
    "economic-2": lambda: MultiProcessingReadingService(2, strategy="economic", timeout=60),
    "chunked-2": lambda: MultiProcessingReadingService(2, strategy="chunked", timeout=60),
}


@pytest.mark.parametrize("name", list(CUSTOM_SERVICES))
def test_a_custom_sharding_point_runs_and_resumes_under_every_service(name):
    expected = run(numbers, None)
    assert [x for batch in expected for x, _ in batch] == list(range(11))
    assert run(numbers, CUSTOM_SERVICES[name]()) == expected
    with DataLoader(numbers(), CUSTOM_SERVICES[name](), seed=0) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(3)]
        state = loader.state_dict()
    with DataLoader(numbers(), CUSTOM_SERVICES[name](), seed=0) as resumed:
        resumed.load_state_dict(state)
        assert head + list(resumed) == expected


def test_shards_of_a_custom_sharding_point_are_merged_round_robin():
    # Output k of shard i of n has position k * n + i.
    with DataLoader(Contiguous(7), ThreadReadingService(2), seed=0) as loader:
        assert list(loader) == [0, 4, 1, 5, 2, 6, 3]
    assert list(DataLoader(Contiguous(7), seed=0)) == list(range(7))


def test_a_custom_source_gets_positions_and_draws_in_process():
    class Letters(IterDataPipe):
        def __iter__(self):
            yield from "abc"

    out = list(DataLoader(Letters().map(lambda x: (x, current_position(), item_seed())), seed=0))
    assert [(x, p) for x, p, _ in out] == [("a", 0), ("b", 1), ("c", 2)]
    assert len({s for _, _, s in out}) == 3


def test_a_custom_source_resumes_in_process_with_its_positions():
    class Counter(IterDataPipe):
        def __init__(self):
            self.next = 0

        def reset(self):
            self.next = 0

        def __iter__(self):
            while self.next < 6:
                self.next += 1
                yield self.next - 1

        def state_dict(self):
            return {"next": self.next}

        def load_state_dict(self, state):
            self.next = state["next"]

    def build():
        return Counter().map(lambda x: (x, current_position()))

    expected = list(DataLoader(build(), seed=0))
    loader = DataLoader(build(), seed=0)
    iterator = iter(loader)
    head = [next(iterator) for _ in range(2)]
    state = loader.state_dict()
    resumed = DataLoader(build(), seed=0)
    resumed.load_state_dict(state)
    assert head + list(resumed) == expected == [(x, x) for x in range(6)]


# -- resuming in a fresh thread (pipeloom.testing) -------------------------------


def test_resume_from_every_step_mid_tar_keeps_item_rng(shard_dir):
    # A resume mid-shard in a fresh process raised "item_rng() was called outside a
    # pipeline": the tar reader did not keep its shard's stamp in its state.
    def build():
        pipe = FileLister(shard_dir, "shard-*.tar").sharding_filter().open_files("rb")
        return pipe.load_from_tar().webdataset().map(sample_draw)

    check_resume_from_every_step(build, steps=[0, 1, 5, 30, 99])


class RepeatsWithoutItsStamp(IterDataPipe):
    """Yields each input twice; its state forgets the input's stamp (the block base keeps it)."""

    inputs = ("source",)

    def __init__(self, source):
        self.source, self.pending = source, []

    def reset(self):
        self.pending = []

    def async_next(self):
        if not self.pending:
            item = self.source.async_next()
            self.pending = [item, item]
        return self.pending.pop()

    def state_dict(self):
        return {"pending": list(self.pending)}

    def load_state_dict(self, state):
        self.pending = list(state["pending"])


def test_a_user_block_that_forgets_its_inputs_stamp_still_resumes_exactly():
    # It used to resume its second copy outside any item (item_rng() raised); the
    # block base now saves the input's stamp and how many outputs were made of it.
    def build():
        return RepeatsWithoutItsStamp(IterableWrapper(range(3))).map(number_draw)

    check_resume_from_every_step(build, steps=[1, 2, 3])


# -- blocks reading several sources ----------------------------------------------


class TwiceWithoutRestamping(IterDataPipe):
    """A user block yielding each input twice, relying on the thread's stamp in between."""

    inputs = ("source",)

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        for item in self.source:
            yield item
            yield item


def stream_with_draws():
    return TwiceWithoutRestamping(IterableWrapper(range(3))).map(number_draw)


def two_draws(x):
    return x, float(item_rng().random()), float(item_rng().random())


@pytest.mark.parametrize("zip_name", ["zip", "zip_longest"])
def test_each_zipped_stream_goes_on_in_its_own_stamp(zip_name):
    # The second copy was drawn from the other stream's stamp: a stream's draws
    # depended on what it was zipped with.
    def firsts(other):
        zipped = getattr(stream_with_draws(), zip_name)(other)
        return [first for first, _ in DataLoader(zipped, seed=0)]

    with_one_draw = firsts(IterableWrapper(range(10, 16)).map(number_draw))
    with_two_draws = firsts(IterableWrapper(range(20, 26)).map(two_draws))
    assert with_one_draw == with_two_draws
    assert len({draw for _, draw in with_one_draw}) == 6


def test_a_tar_given_as_bytes_resumes_in_the_middle_of_its_members():
    # No opener upstream replays a (name, bytes) input, so the members after the
    # checkpoint were lost: the reader now keeps that input in its state.
    from tests.reading_service.random_pipelines import member_number, tar_shards

    def build():
        shards = IterableWrapper(tar_shards(4)).sharding_filter()
        return shards.load_from_tar().map(member_number).map(number_draw)

    check_resume_from_every_step(build)


class DrawingCounter(IterDataPipe):
    """A user's source that draws item_rng() and saves its place (or nothing: replays)."""

    def __init__(self, saves: bool):
        self.saves, self.next = saves, 0

    def reset(self):
        self.next = 0

    def __iter__(self):
        while self.next < 4:
            self.next += 1
            yield self.next - 1, int(item_rng().integers(1 << 30))

    def state_dict(self):
        return {"next": self.next} if self.saves else {}

    def load_state_dict(self, state):
        self.next = state.get("next", 0)


@pytest.mark.parametrize("saves", [True, False])
def test_a_state_saved_after_a_resume_and_before_its_first_item_keeps_the_sources_count(saves):
    # The count of a source the framework numbers was saved only once the epoch's first
    # output had decided its numbering: a state saved right after the resumed epoch
    # started (e.g. from a checkpointing thread) lost it, and the next resume numbered
    # from 0 again: other item_rng() draws (saves) or items read twice (replays).
    def build():
        return DrawingCounter(saves).sharding_filter()

    expected = list(DataLoader(build(), seed=0))
    first = DataLoader(build(), seed=0)
    head = [next(iter(first))]
    state = first.state_dict()
    second = DataLoader(build(), seed=0)
    second.load_state_dict(state)
    iter(second)  # the resumed epoch starts; no item yet
    state = second.state_dict()
    third = DataLoader(build(), seed=0)
    third.load_state_dict(state)
    assert head + list(third) == expected
