"""A checkpoint resumes under any reading service, strategy and worker count."""

from __future__ import annotations

import pytest

from pipeloom import DataLoader, item_rng
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService

pytestmark = pytest.mark.timeout(120)

SERVICES = {
    "in-process": lambda: None,
    "threads-2": lambda: ThreadReadingService(2),
    "classic-3": lambda: MultiProcessingReadingService(3, timeout=60),
    "economic-2": lambda: MultiProcessingReadingService(2, strategy="economic", timeout=60),
    "chunked-2": lambda: MultiProcessingReadingService(2, strategy="chunked", timeout=60),
}

PAIRS = [
    ("in-process", "threads-2"),
    ("threads-2", "in-process"),
    ("classic-3", "chunked-2"),
    ("chunked-2", "classic-3"),
    ("economic-2", "threads-2"),
    ("in-process", "economic-2"),
]


def draw(x):
    return x, float(item_rng().random())


def build():
    return IterableWrapper(range(23)).shuffle().sharding_filter().map(draw).batch(3)


def epochs(service, count=2):
    with DataLoader(build(), service, seed=0) as loader:
        return [list(loader) for _ in range(count)]


@pytest.mark.parametrize(("saved_by", "resumed_by"), PAIRS)
def test_a_state_resumes_under_another_service(saved_by, resumed_by):
    # "in-process" and "workers" states did not load into each other, and states did
    # not move between strategies ("the state has 6 blocks but the pipeline has 4").
    first, second = epochs(None)
    with DataLoader(build(), SERVICES[saved_by](), seed=0) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(3)]
        state = loader.state_dict()
    with DataLoader(build(), SERVICES[resumed_by](), seed=0) as resumed:
        resumed.load_state_dict(state)
        assert head + list(resumed) == first
        assert list(resumed) == second
