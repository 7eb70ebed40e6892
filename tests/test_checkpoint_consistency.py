"""A checkpoint is always taken between two items: from another thread, after shutdown().

Every state says how many items of its epoch were delivered before it
(``state["delivered"]``); resuming it in a fresh loader must give exactly the
rest of the epoch after that many items, and the following epoch unchanged.
"""

from __future__ import annotations

import pickle
import sys

import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, item_rng
from pipeloom.errors import StateError
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)
from tests.checkpoint_snapshots import Snapshotter


def noisy(x):
    return x + round(float(item_rng().random()), 6)


def build(n: int = 240):
    return IterableWrapper(range(n)).shuffle(buffer_size=16).sharding_filter().map(noisy).batch(3)


SERVICES = {
    "in-process": InProcessReadingService,
    "threads": lambda: ThreadReadingService(2),
    "classic": lambda: MultiProcessingReadingService(2),
    "economic": lambda: MultiProcessingReadingService(2, strategy="economic"),
    "chunked": lambda: MultiProcessingReadingService(2, strategy="chunked"),
}
# A state resumes under a service of the same family; threads resume "workers" states fast.
RESUMER = {
    "in-process": InProcessReadingService,
    "threads": lambda: ThreadReadingService(2),
    "classic": lambda: ThreadReadingService(2),
    "economic": SERVICES["economic"],
    "chunked": SERVICES["chunked"],
}


@pytest.fixture(scope="module")
def uninterrupted():
    with DataLoader(build(), seed=4) as loader:
        return [list(loader), list(loader)]


def resume(state, service: str, n: int = 240):
    with DataLoader(build(n), RESUMER[service](), seed=99) as loader:
        loader.load_state_dict(pickle.loads(pickle.dumps(state)))
        return list(loader), list(loader)


@pytest.fixture
def fast_thread_switches():
    """Switch threads every 10 us so the snapshots land everywhere inside a step."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("service", sorted(SERVICES))
def test_snapshots_from_another_thread_resume_to_exactly_the_rest_of_the_epoch(
    service, uninterrupted, fast_thread_switches
):
    received: list = []
    with DataLoader(build(), SERVICES[service](), seed=4) as loader:
        with Snapshotter(loader, received) as snapshotter:
            for item in loader:
                received.append(item)
                snapshotter.race_the_next_step()
    snapshots = snapshotter.snapshots
    assert received == uninterrupted[0]
    mid_epoch = [s for s in snapshots if s[1]["service"] is not None]
    assert len({s[1]["delivered"] for s in mid_epoch}) > 20  # they landed at many steps
    limit = 4 if service in ("economic", "chunked") else 25  # their resumes start processes
    checked = mid_epoch[:: max(1, len(mid_epoch) // limit)][:limit]
    for before, state, after in checked:
        delivered = state["delivered"]
        assert before <= delivered <= after + 1  # the count at the moment it was taken
        rest, following = resume(state, service)
        assert rest == uninterrupted[0][delivered:], f"snapshot after {delivered} items"
        assert following == uninterrupted[1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("service", sorted(SERVICES))
@pytest.mark.parametrize("stop", [0, 7, 80])
def test_shutdown_then_state_dict_mid_epoch_keeps_the_unseen_rest(service, stop, uninterrupted):
    """What a preemption handler does: stop the workers, then save where the loader was."""
    with DataLoader(build(), SERVICES[service](), seed=4) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(stop)]
        loader.shutdown()
        state = loader.state_dict()
    assert (state["epoch"], state["delivered"]) == (0, stop)
    assert loader.state_dict() == state  # asking again gives the same position
    with pytest.raises(RuntimeError, match="no longer valid"):
        next(iterator)
    rest, following = resume(state, service)
    assert head + rest == uninterrupted[0]
    assert following == uninterrupted[1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("service", sorted(SERVICES))
def test_shutdown_after_the_epoch_ended_records_the_next_epoch_start(service, uninterrupted):
    with DataLoader(build(), SERVICES[service](), seed=4) as loader:
        assert list(loader) == uninterrupted[0]
        loader.shutdown()
        state = loader.state_dict()
    assert (state["epoch"], state["delivered"], state["service"]) == (1, 0, None)
    with DataLoader(build(), RESUMER[service](), seed=99) as resumed:
        resumed.load_state_dict(state)
        assert list(resumed) == uninterrupted[1]


def test_state_dict_from_inside_a_step_refuses_clearly():
    """A signal handler runs inside next(loader); so does a block's own code."""
    holder: list = []

    def checkpoint_now(x):
        if x == 3:
            holder[0].state_dict()
        return x

    loader = DataLoader(IterableWrapper(range(6)).map(checkpoint_now), seed=0)
    holder.append(loader)
    iterator = iter(loader)
    assert [next(iterator) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(StateError, match="from inside a step of this loader .* set a flag"):
        next(iterator)


def test_shutdown_from_inside_a_step_stops_but_the_state_is_refused():
    holder: list = []

    def preempted(x):
        if x == 2:
            holder[0].shutdown()  # e.g. a SIGTERM handler that interrupted next(loader)
        return x

    loader = DataLoader(IterableWrapper(range(6)).map(preempted), seed=0)
    holder.append(loader)
    iterator = iter(loader)
    assert [next(iterator), next(iterator)] == [0, 1]
    next(iterator)  # the interrupted step finishes
    with pytest.raises(StateError, match="shutdown\\(\\) was called from inside a step"):
        loader.state_dict()
    with pytest.raises(RuntimeError, match="no longer valid"):
        next(iterator)


def test_an_exception_escaping_a_step_leaves_no_exact_position():
    def fragile(x):
        if x == 4:
            raise KeyError("bad sample")
        return x

    loader = DataLoader(IterableWrapper(range(9)).map(fragile), seed=0)
    iterator = iter(loader)
    assert [next(iterator) for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(KeyError):
        next(iterator)
    with pytest.raises(StateError, match="no exact position to save: KeyError escaped"):
        loader.state_dict()
    with pytest.raises(RuntimeError, match="stopped when KeyError escaped it"):
        next(iterator)  # not a silent end of the epoch
    assert next(iter(loader)) == 0  # a new epoch starts normally


def test_a_resumed_epoch_keeps_counting_delivered_items(uninterrupted):
    with DataLoader(build(), seed=4) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(5)]
        state = loader.state_dict()
    with DataLoader(build(), seed=4) as resumed:
        resumed.load_state_dict(state)
        iterator = iter(resumed)
        head += [next(iterator) for _ in range(6)]
        again = resumed.state_dict()
    assert again["delivered"] == 11
    rest, _ = resume(again, "in-process")
    assert head + rest == uninterrupted[0]
