"""A generator block that yields several outputs of one input gives each its own item key.

Two views of one image, augmented by a ``map`` after a ``shuffle`` (or a
``prefetch``, or a ``threadpool_map``), used to get the same ``item_rng()``
draws: those blocks keep each item's stamp, and the generator left both views
with the input's stamp. Output ``j`` now has the key ``(p, j)``, as ``flatmap``
gives it.
"""

from __future__ import annotations

import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import (
    IterableWrapper,
    IterDataPipe,
    current_key,
    item_rng,
    item_stamp,
    set_item_stamp,
)
from pipeloom.testing import check_same_output_everywhere


class TwoViews(IterDataPipe):
    """Two outputs of each input, written the simple way (no stamps of its own)."""

    inputs = ("source",)

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        for x in self.source:
            yield (x, "a")
            yield (x, "b")


class StampsItsOwn(IterDataPipe):
    """Three outputs per input, stamped by the block itself with ``output=10 + j``."""

    inputs = ("source",)

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        for x in self.source:
            stamp = item_stamp()
            for j in range(3):
                set_item_stamp(stamp, output=10 + j)
                yield x


def crop(view):
    return (*view, int(item_rng().integers(1 << 62)))


def views(n: int = 12):
    return TwoViews(IterableWrapper(range(n)).sharding_filter())


def draws_by_input(outputs) -> dict:
    by_input: dict = {}
    for x, _, draw in outputs:
        by_input.setdefault(x, []).append(draw)
    return by_input


@pytest.mark.parametrize(
    "keeping_stamps",
    [
        lambda p: p.shuffle(buffer_size=5),
        lambda p: p.prefetch(4),
        lambda p: p.threadpool_map(lambda v: v, max_workers=2, scheduled_tasks=4),
    ],
    ids=["shuffle", "prefetch", "threadpool_map"],
)
def test_the_views_of_one_input_draw_different_values_after_blocks_that_keep_stamps(
    keeping_stamps,
):
    with DataLoader(keeping_stamps(views()).map(crop), seed=3) as loader:
        outputs = list(loader)
    by_input = draws_by_input(outputs)
    assert sorted(by_input) == list(range(12))
    assert all(len(set(draws)) == 2 for draws in by_input.values()), by_input


def test_output_j_of_an_input_has_the_key_p_j_as_flatmap_gives_it():
    class Three(TwoViews):
        def __iter__(self):
            for x in self.source:
                for _ in range(3):
                    yield x

    pipe = Three(IterableWrapper(range(2))).map(lambda x: (x, current_key()))
    with DataLoader(pipe, seed=0) as loader:
        assert list(loader) == [(0, 0), (0, (0, 1)), (0, (0, 2)), (1, 1), (1, (1, 1)), (1, (1, 2))]


def test_a_block_that_sets_its_outputs_stamps_keeps_them():
    pipe = StampsItsOwn(IterableWrapper(range(2))).map(lambda x: current_key())
    with DataLoader(pipe, seed=0) as loader:
        assert list(loader) == [(0, 10), (0, 11), (0, 12), (1, 10), (1, 11), (1, 12)]


def test_one_output_per_input_keeps_the_input_key():
    class Evens(TwoViews):
        def __iter__(self):
            yield from (x for x in self.source if x % 2 == 0)

    pipe = Evens(IterableWrapper(range(6))).map(lambda x: (x, current_key()))
    with DataLoader(pipe, seed=0) as loader:
        assert list(loader) == [(0, 0), (2, 2), (4, 4)]


@pytest.mark.timeout(60)
def test_the_views_draw_the_same_values_under_every_service():
    def pipeline():
        return views(8).shuffle(buffer_size=4).map(crop)

    ran = check_same_output_everywhere(pipeline, seed=5)
    assert ran[:3] == ["in-process", "threads", "classic"]


def test_a_replayed_resume_draws_the_same_values_for_the_rest():
    def loader():
        return DataLoader(views(10).shuffle(buffer_size=4).map(crop), seed=1, resume_by_replay=True)

    with loader() as whole:
        expected = list(whole)
    with loader() as first:
        it = iter(first)
        head = [next(it) for _ in range(7)]
        state = first.state_dict()
    with loader() as second:
        second.load_state_dict(state)
        assert head + list(second) == expected
