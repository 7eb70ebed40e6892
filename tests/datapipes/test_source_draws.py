"""A source whose own code draws ``item_rng()`` (an iterable, a generator block) and a block
after it drawing again: the later draws continue after the source's, never repeat them.

The source keyed each item, the user's code drew, then the source stamped the item again
with no draws made, so a ``map``'s first draw gave the source's first numbers again (a
random crop and a noise level, both from the same numbers) — in-process, in fused runs
under ``batch``, and in workers.
"""

from __future__ import annotations

import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, IterDataPipe, item_rng
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)

pytestmark = pytest.mark.timeout(60)

N = 8


def number():
    return int(item_rng().integers(1 << 40))


class Drawing:
    """A plain iterable whose iterator draws for each item it makes."""

    def __iter__(self):
        for i in range(N):
            yield (i, number())


class DrawingBlock(IterDataPipe):
    """A custom source block drawing for each item."""

    def __iter__(self):
        for i in range(N):
            yield (i, number())

    def __len__(self):
        return N


def add_draw(item):
    return (*item, number())


def flat(batches):
    return [item for batch in batches for item in (batch if isinstance(batch, list) else [batch])]


SOURCES = {"iterable": lambda: IterableWrapper(Drawing()), "block": DrawingBlock}
SHAPES = {
    "map": lambda source: source.map(add_draw),
    "map+batch (fused run)": lambda source: source.map(add_draw).batch(3),
    "sharded map+batch": lambda source: source.sharding_filter().map(add_draw).batch(3),
}
SERVICES = {
    "in-process": InProcessReadingService,
    "threads": lambda: ThreadReadingService(2),
    "processes": lambda: MultiProcessingReadingService(2, start_method="fork"),
}


CASES = [(shape, "in-process") for shape in SHAPES] + [
    ("sharded map+batch", service) for service in ("threads", "processes")
]  # without a sharding point every worker would read the whole source


@pytest.mark.parametrize(("shape", "service"), CASES)
@pytest.mark.parametrize("source", list(SOURCES))
def test_a_later_draw_never_repeats_the_sources(source, shape, service):
    pipe = SHAPES[shape](SOURCES[source]())
    with DataLoader(pipe, reading_service=SERVICES[service](), seed=5) as loader:
        items = flat(list(loader))
    assert sorted(i for i, _, _ in items) == list(range(N))
    repeated = [(i, a) for i, a, b in items if a == b]
    assert not repeated, f"the map drew the source's numbers again for {repeated}"
