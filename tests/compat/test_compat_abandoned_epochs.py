"""Persistent workers after a ``break``: torch's global-RNG streams, whatever the timing.

torch's persistent workers fetch every batch they were sent before the next
epoch starts: ``prefetch_factor * num_workers`` beyond those ``next()``
returned. The compat loader's workers catch up to that count, so values that
``__getitem__`` (or an ``IterableDataset``) draws from ``random``, NumPy and
torch in the epochs after a ``break`` are torch's.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.compat import DataLoader
from tests.compat.compat_cases import same

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # torch's


def draws(index: int) -> tuple[int, float, float, float]:
    return index, random.random(), float(np.random.rand()), float(torch.rand(()))


class Draws(tud.Dataset):
    def __len__(self) -> int:
        return 23

    def __getitem__(self, index: int) -> tuple[int, float, float, float]:
        return draws(index)


class StreamOfDraws(tud.IterableDataset):
    """24 items per worker: no worker runs out within a break's prefetch (``_catch_up``)."""

    def __iter__(self):
        info = tud.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return (draws(i) for i in range(worker, 24 * workers, workers))


def run(cls: type, breaks: list[int | None], *, iterable: bool, generator: bool, **kwargs) -> Any:
    """Epochs abandoned after ``breaks[i]`` batches (None: run to the end), then a draw."""
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    if iterable:
        loader = cls(StreamOfDraws(), batch_size=2, **kwargs)
    else:
        seeded = torch.Generator().manual_seed(9) if generator else None
        loader = cls(Draws(), batch_size=2, shuffle=True, generator=seeded, **kwargs)
    seen = []
    try:
        for stop in breaks:
            epoch = iter(loader)
            batches = []
            for batch in epoch if stop != 0 else ():
                batches.append(batch)
                if len(batches) == stop:
                    break
            del epoch  # dropped, as at a break out of a for loop
            seen.append(batches)
        return seen, float(torch.rand(()))
    finally:
        if hasattr(loader, "shutdown"):
            loader.shutdown()


@pytest.mark.timeout(120)
@settings(max_examples=6, deadline=None)
@given(
    iterable=st.booleans(),
    generator=st.booleans(),
    num_workers=st.integers(1, 3),
    prefetch_factor=st.integers(1, 3),
    breaks=st.lists(st.one_of(st.none(), st.integers(0, 7)), min_size=2, max_size=3),
)
def test_persistent_workers_draw_torchs_values_after_any_break(
    iterable, generator, num_workers, prefetch_factor, breaks
):
    kwargs = dict(
        iterable=iterable,
        generator=generator,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor,
        persistent_workers=True,
        multiprocessing_context="fork",
        timeout=30,
    )
    assert same(run(DataLoader, breaks, **kwargs), run(tud.DataLoader, breaks, **kwargs))


@pytest.mark.parametrize("breaks", [[1, None], [3, 1, None]])
def test_a_break_without_workers_draws_torchs_epochs_after_it(breaks):
    # torch draws a RandomSampler's last, discarded permutation only when its iterator
    # asks the sampler past its end: not at a break, and so neither do we
    kwargs = dict(iterable=False, generator=True, num_workers=0)
    assert same(run(DataLoader, breaks, **kwargs), run(tud.DataLoader, breaks, **kwargs))
