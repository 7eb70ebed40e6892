"""state_dict()/load_state_dict(): resume mid-epoch, then the same next epochs (#9)."""

from __future__ import annotations

import io

import pytest
import torch
import torch.utils.data
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.compat import DataLoader
from pipeloom.errors import StateError
from tests.compat.compat_cases import Items, Range, epochs, same, sampling


def roundtrip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def check_resume(dataset, make, stop, **extra):
    torch.manual_seed(0)
    expected = epochs(DataLoader(dataset, **make(), **extra), 2)
    torch.manual_seed(0)
    interrupted = DataLoader(dataset, **make(), **extra)
    set_epoch = getattr(interrupted.sampler, "set_epoch", None)
    if set_epoch is not None:
        set_epoch(0)
    iterator = iter(interrupted)
    seen = [batch for _, batch in zip(range(stop), iterator)]
    state = roundtrip(interrupted.state_dict())
    interrupted.shutdown()

    torch.manual_seed(12345)  # a new process: other seeds until the state is loaded
    resumed = DataLoader(dataset, **make(), **extra)
    resumed.load_state_dict(state)
    with resumed:
        rest = list(resumed) if state["epoch"] is not None else []  # else: epoch complete
        set_epoch = getattr(resumed.sampler, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(1)
        assert same(seen + rest, expected[0])
        assert same(list(resumed), expected[1])


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 16), case=st.data(), stop=st.integers(0, 8))
def test_resume_mid_epoch_yields_the_remaining_batches_then_the_same_epochs(n, case, stop):
    name, make = case.draw(sampling(n), label="sampling")
    check_resume(Items(n), make, stop)


@pytest.mark.parametrize("persistent", [False, True])
def test_resume_with_worker_processes(persistent):
    def make():
        return {"batch_size": 2, "shuffle": True}

    check_resume(Items(11), make, 3, num_workers=2, persistent_workers=persistent)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_iterable_dataset_resumes_by_re_reading_the_epoch(num_workers):
    def make():
        return {"batch_size": 3}

    check_resume(Range(0, 20), make, 2, num_workers=num_workers)


def test_a_state_between_epochs_resumes_at_the_next_epoch():
    def build():
        return DataLoader(
            Items(7), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(1)
        )

    loader = build()
    first = list(loader)
    state = loader.state_dict()
    assert state["epoch"] is None
    second = list(loader)
    resumed = build()
    resumed.load_state_dict(state)
    assert same(list(resumed), second) and not same(first, second)


def test_a_state_from_another_kind_of_loader_is_refused():
    state = DataLoader(Range(0, 3)).state_dict()
    with pytest.raises(StateError, match="over a iterable-style dataset, but this loader reads"):
        DataLoader(Items(3)).load_state_dict(state)
    with pytest.raises(StateError, match=r"expected a compat DataLoader state of version 2 \(or 1"):
        DataLoader(Items(3)).load_state_dict({"version": 99})


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("then", ["state_dict", "shutdown", "iter"])
def test_a_checkpoint_after_a_break_keeps_the_rest_of_that_epoch(num_workers, then):
    def build(cls=DataLoader):
        return cls(
            Items(11),
            batch_size=2,
            shuffle=True,
            generator=torch.Generator().manual_seed(3),
            num_workers=num_workers,
        )

    def break_after_two(loader):
        seen = []
        for batch in loader:  # the loop's iterator is dropped at the break
            seen.append(batch)
            if len(seen) == 2:
                break
        return seen

    expected = epochs(build(), 2)
    loader = build()
    seen = break_after_two(loader)
    if then == "iter":  # a new epoch replaces the abandoned one, as in torch
        theirs = build(torch.utils.data.DataLoader)
        break_after_two(theirs)
        # without workers torch's sampler was not asked past its end: its generator did
        # not draw the epoch's last, discarded permutation, and the next epoch differs
        # from the uninterrupted one
        assert same(list(loader), list(theirs))
        assert loader.state_dict()["epoch"] is None
        return
    if then == "shutdown":
        loader.shutdown()
    state = roundtrip(loader.state_dict())
    resumed = build()
    resumed.load_state_dict(state)
    assert same(seen + list(resumed), expected[0])
    assert same(list(resumed), expected[1])


@pytest.mark.parametrize("sampling", [dict(shuffle=True), dict(shuffle=False), dict()])
def test_a_state_keeps_how_to_draw_the_epoch_not_its_indices(sampling):
    # torch's own samplers: their generator's state before the epoch, not 8 bytes per index
    def build():
        return DataLoader(
            range(1_000_000), batch_size=256, generator=torch.Generator().manual_seed(2), **sampling
        )

    reference = iter(build())
    expected = [next(reference) for _ in range(5)]
    loader = build()
    iterator = iter(loader)
    seen = [next(iterator) for _ in range(2)]
    buffer = io.BytesIO()
    torch.save(loader.state_dict(), buffer)
    assert buffer.tell() < 64 * 1024  # the indices alone would be 7.6 MiB
    buffer.seek(0)
    resumed = build()
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    rest = iter(resumed)
    assert same(seen + [next(rest) for _ in range(3)], expected)
    assert len(resumed) - 2 == sum(1 for _ in rest) + 3
