"""in_memory_cache over items stamped by several blocks (concat, mux, cycle) replays each item
with the stamp it would have had without the cache, so ``item_rng()`` downstream draws as
without it: a replayed epoch ``e`` gives what a fresh loader, whose cache fills in epoch ``e``
(its items live), gives.

The cache used to replay every item with one seed: item 0 of the first source and item 0
of the second (or round 0 and round 1 of a cycle) then drew the same random numbers in
every epoch after the first — silently correlated augmentation.
"""

from __future__ import annotations

import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, item_rng
from pipeloom.reading_service import InProcessReadingService

pytestmark = pytest.mark.timeout(60)

EPOCHS = 3


def draw(x):
    return (x, int(item_rng().integers(1 << 40)))


def concat():  # each source sharded on its own: two blocks stamp the items
    first = IterableWrapper([0, 1]).sharding_filter()
    pipe = first.concat(IterableWrapper(range(500, 503)).sharding_filter())
    return pipe.in_memory_cache().map(draw)


def mux():
    first = IterableWrapper(range(4)).sharding_filter()
    pipe = first.mux_longest(IterableWrapper(range(100, 104)).sharding_filter())
    return pipe.in_memory_cache(allow_random=True).map(draw)


def cycle():
    return IterableWrapper(range(3)).cycle(2).in_memory_cache(allow_random=True).map(draw)


def cycle_batched():  # one batch of both rounds: its stamp (a later round's) is no block's
    pipe = IterableWrapper(range(2)).cycle(2).batch(4)
    return pipe.in_memory_cache(allow_random=True).map(draw)


def loader(pipe):
    return DataLoader(pipe, reading_service=InProcessReadingService(), seed=11)


def replayed(build):
    """Epochs 0, 1, 2 of one loader: the cache fills in epoch 0 and replays after."""
    with loader(build()) as replaying:
        return [sorted(replaying) for _ in range(EPOCHS)]


def filled(build):
    """Epoch e of a fresh loader for each e: the cache fills in it, its items come live."""
    result = []
    for epoch in range(EPOCHS):
        with loader(build()) as fresh:
            fresh.set_epoch(epoch)
            result.append(sorted(fresh))
    return result


@pytest.mark.parametrize("build", [concat, mux, cycle], ids=["concat", "mux", "cycle"])
def test_in_process_draws_as_without_the_cache(build):
    assert replayed(build) == filled(build)


def test_items_no_block_stamped_draw_anew_in_each_epoch():
    """Their seed was learnt from a live item of a replay of the fill epoch (a random
    upstream), so every epoch drew what the first did (independence fuzzer, seed 711646,
    --modes stamps); now the cache reads them live, as without it."""
    epochs = replayed(cycle_batched)
    assert len({value for epoch in epochs for _, value in epoch}) == EPOCHS
    assert epochs == filled(cycle_batched)


@pytest.mark.parametrize("build", [concat, mux, cycle], ids=["concat", "mux", "cycle"])
def test_no_two_items_share_their_draws_in_a_replayed_epoch(build):
    for epoch in replayed(build):
        values = [value for _, value in epoch]
        assert len(set(values)) == len(values), epoch
