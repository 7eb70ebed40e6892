"""Exactly once when batches come in arrival order, and when workers change on resume.

With ``in_order=False`` the batches delivered before a failed one, or before a
checkpoint, are not the first ones of the epoch: going on, or resuming, must
leave out exactly those. An ``IterableDataset``'s epoch depends on the worker
count, so a mid-epoch state resumes only with the same count.
"""

from __future__ import annotations

import collections
import threading
import time

import pytest
import torch
import torch.utils.data as tud
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeloom.compat import DataLoader
from pipeloom.errors import StateError

from .compat_cases import Range

N = 48
BATCH = 4


class Stalls(tud.Dataset):
    """Index ``i`` fails when in ``bad``; the first ``hold`` indices are slow (come late)."""

    def __init__(self, bad: frozenset[int] = frozenset(), hold: int = 8) -> None:
        self.bad, self.hold = bad, hold

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        if index in self.bad:
            raise ValueError(f"bad sample {index}")
        if index < self.hold:
            time.sleep(0.004)  # the other worker's batches arrive first
        return index


def read(iterator, stop: int | None = None) -> tuple[list[int], int]:
    """The indices of the batches ``iterator`` gives (``stop`` batches at most), and failures."""
    got, failures = [], 0
    while stop is None or len(got) < stop * BATCH:
        try:
            got.extend(next(iterator).tolist())
        except StopIteration:
            break
        except ValueError:
            failures += 1
    return got, failures


def once_each(got: list[int], expected: set[int]) -> None:
    counts = collections.Counter(got)
    assert [i for i, c in counts.items() if c > 1] == []
    assert sorted(counts) == sorted(expected)


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_going_on_after_a_failed_batch_in_arrival_order(worker_type):
    dataset = Stalls(bad=frozenset({29}))
    loader = DataLoader(
        dataset, batch_size=BATCH, num_workers=2, in_order=False, worker_type=worker_type
    )
    got, failures = read(iter(loader))
    loader.shutdown()
    assert failures == 1
    once_each(got, set(range(N)) - {28, 29, 30, 31})


@pytest.mark.parametrize(
    "resume", [dict(in_order=False), dict(in_order=True), dict(num_workers=0)], ids=str
)
def test_a_checkpoint_in_arrival_order_resumes_exactly_once(resume):
    loader = DataLoader(Stalls(), batch_size=BATCH, num_workers=2, in_order=False)
    iterator = iter(loader)
    seen, _ = read(iterator, stop=4)
    state = loader.state_dict()
    loader.shutdown()
    arguments = dict(num_workers=2, worker_type="thread") | resume
    resumed = DataLoader(Stalls(), batch_size=BATCH, **arguments)
    resumed.load_state_dict(state)
    rest, _ = read(iter(resumed))
    once_each(seen + rest, set(range(N)))


_RELEASED = threading.Event()  # worker threads share the module, not the dataset


class BatchZeroLast(tud.Dataset):
    """Batch 0 waits until the test released it: batch 1 comes first, for certain."""

    def __init__(self, bad: frozenset[int] = frozenset()) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        if index in self.bad:
            raise ValueError(f"bad sample {index}")
        if index == 0:
            assert _RELEASED.wait(10)
        return index


def test_a_checkpoint_with_a_gap_refuses_a_loader_that_fetches_item_by_item():
    _RELEASED.clear()
    loader = DataLoader(
        BatchZeroLast(), batch_size=BATCH, num_workers=2, in_order=False, worker_type="thread"
    )
    iterator = iter(loader)
    assert next(iterator).tolist() == [4, 5, 6, 7]
    state = loader.state_dict()
    _RELEASED.set()
    loader.shutdown()
    assert state["epoch"]["first"] == 0 and state["epoch"]["skip"] == [1]
    economic = DataLoader(BatchZeroLast(), batch_size=BATCH, num_workers=2, strategy="economic")
    with pytest.raises(StateError, match="strategy='classic'"):
        economic.load_state_dict(state)
    for workers in (2, 0):  # in order now, a failed batch included
        resumed = DataLoader(BatchZeroLast(frozenset({21})), batch_size=BATCH, num_workers=workers)
        resumed.load_state_dict(state)
        rest, failures = read(iter(resumed))
        assert failures == 1
        once_each([4, 5, 6, 7] + rest, set(range(N)) - {20, 21, 22, 23})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    bad=st.frozensets(st.integers(0, N - 1), max_size=3),
    stop=st.integers(0, N // BATCH),
    hold=st.integers(0, 16),
    resume_in_order=st.booleans(),
)
def test_failures_and_a_checkpoint_in_arrival_order_leave_every_other_batch_once(
    bad, stop, hold, resume_in_order
):
    def loader(in_order: bool) -> DataLoader:
        return DataLoader(
            Stalls(bad, hold),
            batch_size=BATCH,
            num_workers=2,
            in_order=in_order,
            worker_type="thread",
        )

    first = loader(in_order=False)
    seen, _ = read(iter(first), stop=stop)  # the iterator is dropped, as after a `break`
    state = first.state_dict()
    first.shutdown()
    rest: list[int] = []
    if state["epoch"] is not None:  # else the epoch ended: a new one would come next
        second = loader(in_order=resume_in_order)
        second.load_state_dict(state)
        rest, _ = read(iter(second))
    failed = {i // BATCH * BATCH + j for i in bad for j in range(BATCH)}
    once_each(seen + rest, set(range(N)) - failed)


@pytest.mark.parametrize("saved,resumed", [(2, 3), (2, 0), (0, 2)])
def test_an_iterable_dataset_refuses_another_worker_count_mid_epoch(saved, resumed):
    loader = DataLoader(Range(0, 40), batch_size=BATCH, num_workers=saved)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    state = loader.state_dict()
    loader.shutdown()
    other = DataLoader(Range(0, 40), batch_size=BATCH, num_workers=resumed)
    with pytest.raises(StateError, match=f"num_workers={saved}.*num_workers={resumed}"):
        other.load_state_dict(state)


def test_an_iterable_dataset_in_arrival_order_resumes_exactly_once():
    def loader(in_order: bool) -> DataLoader:
        return DataLoader(Range(0, 40), batch_size=BATCH, num_workers=2, in_order=in_order)

    first = loader(in_order=False)
    iterator = iter(first)
    seen = [i for _ in range(5) for i in next(iterator).tolist()]
    state = first.state_dict()
    first.shutdown()
    for in_order in (False, True):
        resumed = loader(in_order)
        resumed.load_state_dict(state)
        rest = [i for batch in resumed for i in batch.tolist()]
        once_each(seen + rest, set(range(40)))
    between_epochs = DataLoader(Range(0, 40), batch_size=BATCH, num_workers=3)
    between_epochs.load_state_dict(loader(True).state_dict())  # no epoch: any count
    assert sorted(torch.cat(list(between_epochs)).tolist()) == list(range(40))


class Uneven(tud.IterableDataset):
    """Worker 0 has 4 items, worker 1 has 200: the epoch's positions have gaps."""

    def __iter__(self):
        info = tud.get_worker_info()
        return iter(range(4) if info.id == 0 else range(1000, 1200))


def test_an_iterable_dataset_counts_its_outputs_per_worker():
    def loader(in_order: bool) -> DataLoader:
        return DataLoader(Uneven(), batch_size=2, num_workers=2, in_order=in_order)

    first = loader(in_order=False)
    iterator = iter(first)
    seen, taken = [], 0
    while taken < 60 or not set(range(4)) <= set(seen):  # worker 0 may start late
        seen += next(iterator).tolist()
        taken += 1
    state = first.state_dict()
    first.shutdown()
    assert state["epoch"]["outputs"] == [2, taken - 2]  # not the positions after the gap
    resumed = loader(in_order=True)
    resumed.load_state_dict(state)
    rest = [i for batch in resumed for i in batch.tolist()]
    once_each(seen + rest, set(range(4)) | set(range(1000, 1200)))
