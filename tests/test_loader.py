"""DataLoader with the in-process reading service."""

from __future__ import annotations

import pickle

import pytest
import torch

from pipeloom import DataLoader, InProcessReadingService
from pipeloom.datapipes import IterableWrapper, SequenceWrapper, item_rng
from pipeloom.errors import StateError
from pipeloom.reading_service import ThreadReadingService


def noisy(n=8):
    return IterableWrapper(range(n)).map(lambda x: x + float(item_rng().random()))


def test_each_iter_is_a_new_epoch_with_different_randomness():
    loader = DataLoader(noisy(), seed=0)
    first, second = list(loader), list(loader)
    assert first != second
    assert loader.epoch == 2


def test_same_seed_and_epoch_give_the_same_items():
    a, b = DataLoader(noisy(), seed=5), DataLoader(noisy(), seed=5)
    assert list(a) == list(b)
    a.set_epoch(3)
    b.set_epoch(3)
    assert list(a) == list(b)


def test_an_epoch_draws_the_same_after_another_epoch_stopped_in_this_thread():
    # The item stamp is per thread: an in-process epoch left after its first item
    # (another loader's, or this one's before a restart) gave the next epoch's first
    # item its draws, so item 0 drew other numbers than it draws alone (or in workers).
    truth = list(DataLoader(noisy(3), seed=1))
    other = iter(DataLoader(noisy(3), seed=1))
    next(other)  # left mid-epoch
    assert list(DataLoader(noisy(3), seed=1)) == truth
    zipped = zip(DataLoader(noisy(3), seed=1), DataLoader(noisy(3), seed=1))
    assert [b for _, b in zipped] == truth  # two loaders read in lockstep
    loader = DataLoader(noisy(3), seed=1)
    next(iter(loader))  # a break after the first item, then the same epoch again
    loader.set_epoch(0)
    assert list(loader) == truth


def test_set_epoch_replays_an_epoch():
    loader = DataLoader(noisy(), seed=1)
    list(loader)
    second = list(loader)
    loader.set_epoch(1)
    assert list(loader) == second


def test_without_a_seed_torch_manual_seed_makes_runs_reproducible():
    torch.manual_seed(0)
    a = list(DataLoader(noisy()))
    torch.manual_seed(0)
    assert list(DataLoader(noisy())) == a


def test_map_style_and_plain_sources_are_accepted():
    assert list(DataLoader(SequenceWrapper("ab"))) == ["a", "b"]
    assert list(DataLoader([1, 2])) == [1, 2]
    assert len(DataLoader([1, 2, 3])) == 3


def test_bad_arguments_say_what_was_expected():
    with pytest.raises(TypeError, match="reading_service must be a ReadingService.*got int"):
        DataLoader([1], 4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="seed must be an int or None, got float"):
        DataLoader([1], seed=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epoch must be an int >= 0"):
        DataLoader([1]).set_epoch(-2)


def test_a_block_that_declares_no_inputs_reads_its_block_attributes():
    from pipeloom.datapipes import IterDataPipe

    class TorchdataStyle(IterDataPipe):
        def __init__(self, source):
            self.source = source

        def __iter__(self):
            yield from self.source

    assert list(DataLoader(TorchdataStyle(IterableWrapper([1, 2])))) == [1, 2]


def test_hidden_inputs_are_caught_at_construction():
    from pipeloom.datapipes import IterDataPipe

    class Sneaky(IterDataPipe):
        inputs = ("source",)

        def __init__(self, source, side):
            self.source, self.side = source, side

        def __iter__(self):
            yield from zip(self.source, self.side)

    with pytest.raises(TypeError, match="attribute 'side' but its inputs = \\('source',\\)"):
        DataLoader(Sneaky(IterableWrapper([1]), IterableWrapper([2])))


def test_state_dict_mid_epoch_resumes_exactly_in_a_new_loader():
    loader = DataLoader(noisy(10), seed=2)
    list(loader)
    iterator = iter(loader)
    head = [next(iterator) for _ in range(4)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    rest = list(iterator)
    resumed = DataLoader(noisy(10), seed=99)
    resumed.load_state_dict(state)
    assert head + list(resumed) == head + rest
    assert list(resumed) == list(loader)  # the following epoch continues identically


def test_state_dict_between_epochs_starts_the_next_epoch():
    loader = DataLoader(noisy(), seed=2)
    list(loader)
    state = loader.state_dict()
    expected = list(loader)
    resumed = DataLoader(noisy(), seed=2)
    resumed.load_state_dict(state)
    assert list(resumed) == expected


def test_load_state_dict_rejects_foreign_objects():
    with pytest.raises(StateError, match=r"expected a DataLoader state of version 2 \(or 1, from"):
        DataLoader([1]).load_state_dict({"version": 0})


def test_a_new_epoch_invalidates_the_previous_iterator():
    loader = DataLoader(range(5))
    first = iter(loader)
    next(first)
    iter(loader)
    with pytest.raises(RuntimeError, match=r"no longer valid: a newer iter\(loader\)"):
        next(first)


def test_end_epoch_stops_the_running_epoch_and_the_next_iter_runs_the_one_after():
    loader = DataLoader(range(5))
    loader.end_epoch()  # between epochs: nothing to stop
    first = iter(loader)
    next(first)
    loader.end_epoch()
    with pytest.raises(RuntimeError, match=r"no longer valid: .* or end_epoch\(\) replaced it"):
        next(first)
    assert list(loader) == [0, 1, 2, 3, 4]
    assert loader.next_epoch == 2  # epoch 1 ran after the ended epoch 0


def test_a_loader_built_over_the_blocks_of_another_takes_them():
    # Both seeded, restarted and read the same blocks: the first silently ran on the second's
    # seed, and an epoch of one lost items to the other's (validation sharing a prefix).
    def shuffled():
        return IterableWrapper(range(10)).shuffle().batch(2)

    pipe = shuffled()
    first = DataLoader(pipe, seed=1)
    running = iter(first)
    next(running)
    validation = DataLoader(pipe.header(2), seed=2)  # shares every block of `pipe`
    taken = r"shares Batcher\(batch_size=2.* with a DataLoader built after it"
    with pytest.raises(RuntimeError, match="no longer valid: this DataLoader's pipeline " + taken):
        next(running)
    with pytest.raises(RuntimeError, match=taken + r".*Build the pipeline once per loader"):
        iter(first)
    batches = list(validation)
    assert len(batches) == 2 and len({x for batch in batches for x in batch}) == 4
    first.shutdown()


def test_loaders_built_one_after_another_over_one_pipeline_run_the_newest():
    pipe = IterableWrapper(range(6)).shuffle()
    epochs = []
    for epoch in range(3):  # a new loader per epoch, the old one dropped or shut down
        loader = DataLoader(pipe, seed=0)
        loader.set_epoch(epoch)
        epochs.append(list(loader))
        if epoch == 1:
            loader.shutdown()
    fresh = DataLoader(IterableWrapper(range(6)).shuffle(), seed=0)
    assert epochs == [list(fresh) for _ in range(3)]


def test_shutdown_and_context_manager():
    with DataLoader([1, 2]) as loader:
        assert list(loader) == [1, 2]
    with pytest.raises(RuntimeError, match="shut down"):
        iter(loader)
    loader.shutdown()  # idempotent


def test_placement_describes_where_blocks_run():
    loader = DataLoader(IterableWrapper([1]).map(str), InProcessReadingService())
    placement = loader.placement()
    assert {where for _, where in placement.locations} == {"main thread"}
    assert "subgraph cluster_0" in placement.to_dot()


def test_an_attribute_hiding_a_chaining_method_is_caught_at_construction():
    from pipeloom.datapipes import IterDataPipe

    class Buffered(IterDataPipe):
        inputs = ("source",)

        def __init__(self, source, prefetch):
            self.source, self.prefetch = source, prefetch

        def __iter__(self):
            yield from self.source

    with pytest.raises(TypeError, match="attribute 'prefetch', which hides the chaining method"):
        DataLoader(Buffered(IterableWrapper([1]), 4))


def test_a_block_without_state_support_is_named_unless_replay_is_allowed():
    from tests.datapipes.helpers import OldStyleDouble

    def pipe():
        return OldStyleDouble(IterableWrapper(range(10)))

    loader = DataLoader(pipe(), seed=0)
    iterator = iter(loader)
    next(iterator)
    with pytest.raises(StateError, match="OldStyleDouble does not implement state_dict"):
        loader.state_dict()

    replaying = DataLoader(pipe(), seed=0, resume_by_replay=True)
    iterator = iter(replaying)
    head = [next(iterator) for _ in range(4)]
    state = replaying.state_dict()
    assert state["service"] == {"kind": "replay", "delivered": 4}
    resumed = DataLoader(pipe(), seed=0, resume_by_replay=True)
    resumed.load_state_dict(state)
    assert head + list(resumed) == list(range(0, 20, 2))


def test_state_survives_torch_save_and_a_weights_only_load(tmp_path):
    loader = DataLoader(IterableWrapper(range(50)).shuffle(buffer_size=8).batch(4), seed=1)
    iterator = iter(loader)
    head = [next(iterator) for _ in range(3)]
    torch.save(loader.state_dict(), tmp_path / "loader.pt")
    expected = list(iterator)
    resumed = DataLoader(IterableWrapper(range(50)).shuffle(buffer_size=8).batch(4), seed=1)
    resumed.load_state_dict(torch.load(tmp_path / "loader.pt", weights_only=True))
    assert head + list(resumed) == head + expected


@pytest.mark.parametrize("first", ["in-process", "threads"])
def test_a_pipeline_an_earlier_loader_ran_as_one_ranks_share_is_whole_again(first):
    """The sharding point kept the rank's shard (and its groups of positions) set by the
    earlier loader's service: a loader of its own read half the epoch, silently."""
    pipe = IterableWrapper(range(10)).sharding_filter().map(lambda x: x * 10).batch(2)
    share = InProcessReadingService() if first == "in-process" else ThreadReadingService(2)
    share.set_outer_sharding(2, 1)
    assert list(DataLoader(pipe, share, seed=0)) == [[20, 30], [60, 70]]
    whole = [[0, 10], [20, 30], [40, 50], [60, 70], [80, 90]]
    assert list(DataLoader(pipe, seed=0)) == whole
