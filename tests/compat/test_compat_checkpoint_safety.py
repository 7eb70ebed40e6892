"""The compat loader's checkpoints: between two batches, after shutdown(), for this dataset only."""

from __future__ import annotations

import io
import random
import sys

import numpy as np
import pytest
import torch

from pipeloom.compat import DataLoader
from pipeloom.errors import StateError
from tests.checkpoint_snapshots import Snapshotter
from tests.compat.compat_cases import Items, same
from tests.compat.test_compat_torch_identical import Augmented


def roundtrip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def seeded_epochs(build, count=2):
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    with build() as loader:
        return [list(loader) for _ in range(count)]


def resumed_epochs(build, state):
    torch.manual_seed(1234)  # a new process: other RNG states until the state is loaded
    random.seed(0)
    np.random.seed(0)
    with build() as loader:
        loader.load_state_dict(roundtrip(state))
        return list(loader), list(loader)


class SlowAugmented(Augmented):
    """More global-RNG draws per item: a longer step for a snapshot to land in."""

    def __getitem__(self, index: int):
        for _ in range(30):
            torch.rand(16)
            random.random()
        return super().__getitem__(index)


def in_process():
    return DataLoader(SlowAugmented(60), batch_size=3, shuffle=True)  # draws from global RNGs


def two_workers():
    return DataLoader(Items(40), batch_size=3, shuffle=True, num_workers=2)


BUILDERS = {"in-process": in_process, "2 workers": two_workers}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_snapshots_from_another_thread_resume_exactly(name):
    build = BUILDERS[name]
    expected = seeded_epochs(build)
    received: list = []
    snapshots: list = []
    before_switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        torch.manual_seed(0)
        random.seed(0)
        np.random.seed(0)
        with build() as loader:
            with Snapshotter(loader, received) as snapshotter:
                for batch in loader:
                    received.append(batch)
                    snapshotter.race_the_next_step()
            snapshots = snapshotter.snapshots
    finally:
        sys.setswitchinterval(before_switch)
    assert same(received, expected[0])
    mid_epoch = [s for s in snapshots if s[1]["epoch"] is not None]
    assert len({s[1]["epoch"]["delivered"] for s in mid_epoch}) > 3
    limit = len(mid_epoch) if name == "in-process" else 6  # resuming workers takes longer
    for before, state, after in mid_epoch[:: max(1, len(mid_epoch) // limit)][:limit]:
        delivered = state["epoch"]["delivered"]
        assert before <= delivered <= after + 1
        rest, following = resumed_epochs(build, state)
        assert same(rest, expected[0][delivered:]), f"snapshot after {delivered} batches"
        assert same(following, expected[1])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(BUILDERS))
@pytest.mark.parametrize("stop", [0, 5])
def test_shutdown_then_state_dict_keeps_the_rest_of_the_epoch(name, stop):
    build = BUILDERS[name]
    expected = seeded_epochs(build)
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    loader = build()
    iterator = iter(loader)
    head = [next(iterator) for _ in range(stop)]
    loader.shutdown()
    state = loader.state_dict()
    assert state["epoch"]["delivered"] == stop
    rest, following = resumed_epochs(build, state)
    assert same(head + rest, expected[0])
    assert same(following, expected[1])


def test_shutdown_after_the_epoch_ended_records_the_next_epoch():
    expected = seeded_epochs(in_process)
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    loader = in_process()
    assert same(list(loader), expected[0])
    loader.shutdown()
    state = loader.state_dict()
    assert state["epoch"] is None
    rest, _ = resumed_epochs(in_process, state)
    assert same(rest, expected[1])


def test_a_state_of_a_bigger_dataset_is_refused_and_strict_false_overrides():
    def build(n):
        return DataLoader(Items(n), batch_size=4, shuffle=True)

    loader = build(200)
    iterator = iter(loader)
    next(iterator)
    state = roundtrip(loader.state_dict())
    with pytest.raises(
        StateError,
        match=r"(?s)different dataset or sampler.*dataset: saved Items of 200 items, now "
        r"Items of 50 items.*load_state_dict\(state, strict=False\)",
    ):
        build(50).load_state_dict(state)
    other = DataLoader(Items(200), batch_size=8, shuffle=True)
    with pytest.raises(StateError, match="batch_size: saved 4, now 8"):
        other.load_state_dict(state)
    same_size = build(200)
    same_size.load_state_dict(state)
    assert len(list(same_size)) == 49
    forced = DataLoader(Items(200), batch_size=8, shuffle=True)
    forced.load_state_dict(state, strict=False)  # the user says the change is harmless
    assert len(list(forced)) > 0


@pytest.mark.parametrize(
    "path, value, match",
    [
        (("epoch", "delivered"), 3.5, "field 'delivered' must be an int"),
        (("epoch", "delivered"), -1, "field 'delivered' must be an int"),
        (("epoch", "delivered"), 10**6, r"field 'delivered' must be an int in \[0, 10\]"),
        (("epoch", "base_seed"), "xyz", "field 'base_seed' must be an int"),
        (("epoch", "entries"), "xyz", "field 'entries' must be"),
        (("epoch",), [1, 2], "field 'epoch' must be None or the interrupted epoch"),
        (("workers_base_seed",), 1.5, "field 'workers_base_seed' must be None or an int"),
        (("generators",), "xyz", "field 'generators' must be a list"),
        (("global_rng",), torch.zeros(3), "field 'global_rng' must be None or torch's RNG"),
        (("kind",), "stream", "field 'kind' must be 'map' or 'iterable'"),
        (("fingerprint",), None, "fingerprint is damaged"),
    ],
)
def test_damaged_fields_raise_a_state_error_naming_them(path, value, match):
    loader = DataLoader(Items(40), batch_size=4, shuffle=True)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    target = state
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(StateError, match=match):
        DataLoader(Items(40), batch_size=4, shuffle=True).load_state_dict(state)


def test_damaged_batch_offsets_are_refused():
    order = list(range(40))[::-1]  # a sampler pipeloom does not know: its indices are saved
    loader = DataLoader(Items(40), batch_size=4, sampler=order)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    state["epoch"]["entries"]["offsets"] = torch.tensor([0, 8, 4, 40])
    with pytest.raises(StateError, match="batch offsets from 0 to len"):
        DataLoader(Items(40), batch_size=4, sampler=order).load_state_dict(state)


@pytest.mark.parametrize(
    "damage",
    [
        {"n": -1},
        {"generator_state": torch.zeros(3, dtype=torch.uint8)},
        {"batch_size": 0},
        {"replacement": 1},
    ],
    ids=str,
)
def test_a_damaged_sampler_recipe_is_refused(damage):
    loader = DataLoader(Items(40), batch_size=4, shuffle=True)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    state["epoch"]["entries"]["recipe"].update(damage)
    with pytest.raises(StateError, match="'recipe'"):
        DataLoader(Items(40), batch_size=4, shuffle=True).load_state_dict(state)


def test_an_old_state_without_a_fingerprint_loads_with_a_warning():
    loader = DataLoader(Items(12), batch_size=4, shuffle=True)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    del state["fingerprint"]
    state["version"] = 1
    resumed = DataLoader(Items(12), batch_size=4, shuffle=True)
    with pytest.warns(UserWarning, match="state version 1"):
        resumed.load_state_dict(state)
    assert len(list(resumed)) == 2
