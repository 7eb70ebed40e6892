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
from pipeloom.errors import NotAvailable
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
    for x, *_, draw in outputs:
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


class TwoViewsAsync(IterDataPipe):
    """Two outputs of each input, written with async_next, keeping its place in its state.

    ``wait=True``: it waits once (``NotAvailable``) after each pull, as a block
    waiting on a thread would, before handing out the first view.
    """

    inputs = ("source",)

    def __init__(self, source, wait=False):
        self.source, self.wait = source, wait
        self._pending: list = []
        self._waited = False

    def reset(self):
        self._pending, self._waited = [], False

    def async_next(self):
        if not self._pending:
            x = self.source.async_next()
            self._pending, self._waited = [(x, "a"), (x, "b")], False
        if self.wait and not self._waited:
            self._waited = True
            raise NotAvailable
        return self._pending.pop(0)

    def state_dict(self):
        return {"pending": list(self._pending)}

    def load_state_dict(self, state):
        self._pending = list(state["pending"])


def test_the_views_of_a_block_written_with_async_next_draw_different_values():
    pipe = TwoViewsAsync(IterableWrapper(range(12)).sharding_filter()).shuffle(buffer_size=5)
    with DataLoader(pipe.map(crop), seed=3) as loader:
        by_input = draws_by_input(list(loader))
    assert sorted(by_input) == list(range(12))
    assert all(len(set(draws)) == 2 for draws in by_input.values()), by_input


def test_a_block_that_waits_before_its_first_view_gives_the_same_keys():
    def keys(wait):
        pipe = TwoViewsAsync(IterableWrapper(range(3)), wait=wait)
        return list(pipe.map(lambda v: (v, current_key())))

    expected = [((x, v), k) for x in range(3) for v, k in (("a", x), ("b", (x, 1)))]
    assert keys(False) == keys(True) == expected


def test_a_generator_that_draws_between_its_outputs_gives_each_its_own_key():
    class DrawingViews(TwoViews):
        def __iter__(self):
            for x in self.source:
                for _ in range(2):
                    yield (x, int(item_rng().integers(1 << 62)))

    pipe = DrawingViews(IterableWrapper(range(4))).prefetch(3).map(crop)
    with DataLoader(pipe, seed=2) as loader:
        outputs = list(loader)
    draws = [draw for _, own, crops in outputs for draw in (own, crops)]
    assert len(draws) == 16
    assert len(set(draws)) == 16, outputs  # the second view's own draw was the first's crop


@pytest.mark.timeout(60)
def test_the_async_views_draw_the_same_values_under_every_service_and_resume():
    def pipeline():
        views = TwoViewsAsync(IterableWrapper(range(8)).sharding_filter())
        return views.map(lambda v: (*v, current_key())).map(crop)

    check_same_output_everywhere(pipeline, seed=5)
    with DataLoader(pipeline(), seed=1) as whole:
        expected = list(whole)
    assert [key for _, _, key, _ in expected[4:6]] == [2, (2, 1)]
    with DataLoader(pipeline(), seed=1) as first:
        it = iter(first)
        head = [next(it) for _ in range(5)]  # stops between the two views of input 2
        state = first.state_dict()
    with DataLoader(pipeline(), seed=1) as second:
        second.load_state_dict(state)
        assert head + list(second) == expected
