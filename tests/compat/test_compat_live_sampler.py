"""Samplers drawn as the epoch goes: endless ones, ones without ``__len__``.

torch's loader asks its sampler for an output only when it hands a batch to a
worker, so an endless sampler (detectron2's ``TrainingSampler``, MMEngine's
``InfiniteSampler``, which has a ``__len__``) works with it: the training loop
calls ``next()`` as long as it likes. The compat loader draws such samplers
with torch's timing and yields torch's batches under every worker type and
strategy.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud

from pipeloom.compat import DataLoader
from pipeloom.errors import StateError
from tests.compat.compat_cases import same

pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),  # torch's
    pytest.mark.timeout(120),
]

SIZE = 20


class Endless(tud.Sampler):
    """A new permutation after another, from its own generator; counts its outputs."""

    def __init__(self, size: int = SIZE, length: int | None = None) -> None:
        self.size = size
        self.length = length  # MMEngine's InfiniteSampler says the dataset's size
        self.drawn = 0

    def __iter__(self):
        generator = torch.Generator().manual_seed(3)
        while True:
            for index in torch.randperm(self.size, generator=generator).tolist():
                self.drawn += 1
                yield index

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("endless")
        return self.length


class WithoutLength(tud.Sampler):
    """A finite sampler with no ``__len__`` (torch's ``Sampler`` defines none)."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self):
        return iter(range(self.count - 1, -1, -1))


class Draws(tud.Dataset):
    """An index and a draw from the worker's global torch RNG (torch's worker seeding)."""

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index, int(torch.randint(1 << 30, ()))])


def take(loader: Any, count: int) -> list[Any]:
    iterator = iter(loader)
    return [next(iterator) for _ in range(count)]


def classic_kwargs() -> list[dict[str, Any]]:
    return [
        {},
        {"num_workers": 2},
        {"num_workers": 2, "persistent_workers": True},
        {"num_workers": 3, "prefetch_factor": 1},
        {"num_workers": 2, "multiprocessing_context": "spawn", "persistent_workers": True},
    ]


@pytest.mark.parametrize("kwargs", classic_kwargs(), ids=str)
@pytest.mark.parametrize("length", [None, SIZE], ids=["no-len", "len"])
def test_an_endless_sampler_gives_torchs_batches_and_draws(kwargs, length):
    torch.manual_seed(1)
    theirs = tud.DataLoader(Draws(), sampler=Endless(length=length), batch_size=3, **kwargs)
    expected = take(theirs, 25)
    torch.manual_seed(1)
    sampler = Endless(length=length)
    with DataLoader(Draws(), sampler=sampler, batch_size=3, **kwargs) as ours:
        got = take(ours, 25)
        assert same(got, expected)
        # asked as torch asks: 25 batches returned, prefetch_factor * workers more sent
        workers = kwargs.get("num_workers", 0)
        ahead = kwargs.get("prefetch_factor", 2) * workers
        if length is None:  # (with a length, the first len + 1 outputs are drawn at iter())
            assert sampler.drawn == 3 * (25 + ahead)
        torch.manual_seed(2)
        again = take(ours, 4)  # a new epoch: the sampler starts again
    torch.manual_seed(2)
    assert same(again, take(theirs, 4))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_workers": 2, "worker_type": "thread"},
        {"num_workers": 2, "strategy": "economic"},
        {"num_workers": 2, "strategy": "chunked"},
        {"num_workers": 3, "in_order": False},
    ],
    ids=str,
)
def test_an_endless_sampler_under_threads_and_every_strategy(kwargs):
    expected = [
        b.tolist() for b in take(tud.DataLoader(range(SIZE), sampler=Endless(), batch_size=4), 30)
    ]
    with DataLoader(range(SIZE), sampler=Endless(), batch_size=4, **kwargs) as ours:
        got = [b.tolist() for b in take(ours, 30)]
    if kwargs.get("in_order", True):
        assert got == expected
    else:  # arrival order: the same batches, each once, from those torch had sent
        assert len({tuple(b) for b in got}) == 30
        torchs = tud.DataLoader(range(SIZE), sampler=Endless(), batch_size=4)
        sent = {tuple(b.tolist()) for b in take(torchs, 30 + 6)}
        assert {tuple(b) for b in got} <= sent


@pytest.mark.parametrize(
    "kwargs", [{}, {"num_workers": 2}, {"num_workers": 2, "strategy": "economic"}], ids=str
)
def test_a_finite_sampler_without_len_is_read_to_its_end(kwargs):
    with DataLoader(range(30), sampler=WithoutLength(30), batch_size=4, **kwargs) as ours:
        for _ in range(2):
            got = [b.tolist() for b in ours]
            assert got == [
                b.tolist()
                for b in tud.DataLoader(range(30), sampler=WithoutLength(30), batch_size=4)
            ]
        with pytest.raises(TypeError):
            len(ours)  # as torch's: the sampler has none


def test_a_sampler_that_yields_more_than_its_len_goes_on_past_it():
    # MMEngine's InfiniteSampler: __len__ is the dataset's size, the iterator endless
    with DataLoader(
        range(SIZE), sampler=Endless(length=SIZE), batch_size=None, num_workers=2
    ) as ours:
        got = [int(x) for x in take(ours, 3 * SIZE)]
    assert got == list(itertools.islice(iter(Endless()), 3 * SIZE))


def test_a_checkpoint_of_a_live_epoch_is_refused_with_the_reason():
    with DataLoader(range(SIZE), sampler=Endless(), batch_size=2, num_workers=2) as ours:
        iterator = iter(ours)
        next(iterator)
        with pytest.raises(StateError, match="drawn as the epoch goes.*__len__"):
            ours.state_dict()
        assert next(iterator).tolist()  # the epoch goes on


def test_a_finite_sampler_with_len_still_checkpoints():
    # drawn whole at iter(), as before: a checkpoint resumes where it stopped
    with DataLoader(range(30), sampler=WithoutLength(30), batch_size=4) as ours:
        ours.sampler.__class__.__len__ = lambda self: self.count  # type: ignore[method-assign]
        try:
            iterator = iter(ours)
            first = [next(iterator).tolist() for _ in range(3)]
            state = ours.state_dict()
        finally:
            del WithoutLength.__len__
    with DataLoader(range(30), sampler=WithoutLength(30), batch_size=4) as resumed:
        resumed.load_state_dict(state)
        rest = [b.tolist() for b in resumed]
    assert first + rest == [
        b.tolist() for b in tud.DataLoader(range(30), sampler=WithoutLength(30), batch_size=4)
    ]


@pytest.mark.parametrize("persistent", [False, True])
def test_leaving_an_endless_epoch_ends_the_waiting_workers_at_once(persistent):
    with DataLoader(
        range(SIZE), sampler=Endless(), batch_size=2, num_workers=2, persistent_workers=persistent
    ) as ours:
        for _ in range(3):
            iterator = iter(ours)
            assert len([next(iterator) for _ in range(5)]) == 5
        started = time.monotonic()
        ours.shutdown()
        # workers wait for outputs the main process will never draw: woken, not killed
        assert time.monotonic() - started < 4.0


class DiesAt(tud.Dataset):
    """Its worker process dies (SIGKILL) fetching index ``SIZE - 1``."""

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> int:
        if index == SIZE - 1 and tud.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return index


def test_a_worker_killed_in_a_live_epoch_raises_and_shuts_down():
    ours = DataLoader(DiesAt(), sampler=Endless(), batch_size=2, num_workers=2)
    iterator = iter(ours)
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        for _ in range(SIZE):
            next(iterator)
    started = time.monotonic()
    ours.shutdown()
    assert time.monotonic() - started < 4.0


def test_an_output_too_big_for_the_ring_says_how_to_fix_it():
    class Growing(tud.Sampler):
        def __iter__(self):
            for size in itertools.count(1):
                yield list(range(4**size))

    with DataLoader(range(1 << 20), batch_sampler=Growing(), num_workers=1) as ours:
        with pytest.raises(ValueError, match="bytes.*__len__"):
            take(ours, 12)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"num_workers": 2}, {"num_workers": 2, "strategy": "economic"}, {"batch_size": None}],
    ids=str,
)
def test_a_sequential_epoch_over_a_huge_dataset_starts_at_once(kwargs):
    # torch's SequentialSampler holds nothing; an array of its 10**12 indices would be 8 TB
    huge = range(10**12)
    args = {"batch_size": 3, **kwargs}
    torchs = {k: v for k, v in args.items() if k != "strategy"}
    with DataLoader(huge, **args) as ours:
        got = take(ours, 4)
        assert same(got, take(tud.DataLoader(huge, **torchs), 4))
        assert len(ours) == len(tud.DataLoader(huge, **torchs))


def test_a_sequential_epoch_resumes_from_a_checkpoint_without_its_indices():
    with DataLoader(range(50), batch_size=4, drop_last=True, num_workers=2) as ours:
        iterator = iter(ours)
        first = [next(iterator).tolist() for _ in range(5)]
        state = ours.state_dict()
    assert "flat" not in state["epoch"]["entries"]  # the recipe and a position, no indices
    with DataLoader(range(50), batch_size=4, drop_last=True) as resumed:
        resumed.load_state_dict(state)
        rest = [b.tolist() for b in resumed]
    assert first + rest == [
        b.tolist() for b in tud.DataLoader(range(50), batch_size=4, drop_last=True)
    ]


class ReusesItsBatch(tud.Sampler):
    """A batch sampler that refills one list (or NumPy buffer) for every batch."""

    def __init__(self, kind: str, length: bool = True) -> None:
        self.kind, self.length = kind, length

    def __len__(self) -> int:
        if not self.length:
            raise TypeError("no length")
        return 3

    def __iter__(self):
        buffer: Any = [] if self.kind == "list" else np.zeros(3, dtype=np.int64)
        for start in range(0, 7, 3):
            indices = list(range(start, min(start + 3, 7)))
            if self.kind == "list":
                buffer.clear()
                buffer.extend(indices)
                yield buffer
            else:
                view = buffer[: len(indices)]
                view[:] = indices
                yield view


@pytest.mark.parametrize("length", [True, False], ids=["len", "no-len"])
@pytest.mark.parametrize("kind", ["list", "array"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_sampler_that_reuses_its_batch_object_gives_each_batch(kind, length, workers):
    sampler = ReusesItsBatch(kind, length)
    with DataLoader(range(7), batch_sampler=sampler, num_workers=workers) as ours:
        got = [b.tolist() for b in ours]
    assert got == [[0, 1, 2], [3, 4, 5], [6]]
    if workers == 0:  # torch's workers read the reused object later, racing the sampler
        assert got == [b.tolist() for b in tud.DataLoader(range(7), batch_sampler=sampler)]


class Grows(tud.Sampler):
    """100 indices at epoch 0, 12,000 after ``set_epoch(1)`` (a curriculum; 96 KB of plan)."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return 100 if self.epoch == 0 else 12_000

    def __iter__(self):
        return iter(range(len(self)))


class PidAndDraw(tud.Dataset):
    def __len__(self) -> int:
        return 12_000

    def __getitem__(self, index: int) -> list[int]:
        return [index, os.getpid(), int(torch.randint(1 << 30, ()))]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_persistent_workers_go_on_when_the_sampler_epoch_grows(context):
    def two_epochs(cls: type) -> list[torch.Tensor]:
        torch.manual_seed(0)
        sampler = Grows()
        loader = cls(
            PidAndDraw(),
            sampler=sampler,
            batch_size=50,
            collate_fn=torch.tensor,
            num_workers=2,
            persistent_workers=True,
            multiprocessing_context=context,
        )
        first = torch.cat(list(loader))
        sampler.set_epoch(1)
        second = torch.cat(list(loader))
        if hasattr(loader, "shutdown"):
            loader.shutdown()
        return [first, second]

    ours, theirs = two_epochs(DataLoader), two_epochs(tud.DataLoader)
    # the same worker processes (the plan grew in place) and torch's RNG streams
    assert set(ours[0][:, 1].tolist()) == set(ours[1][:, 1].tolist())
    assert torch.equal(ours[1][:, [0, 2]], theirs[1][:, [0, 2]])
