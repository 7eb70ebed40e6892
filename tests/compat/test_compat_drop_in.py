"""A user switching the import keeps what they configured torch's loader with."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
import torch.utils.data as tud
import torch.utils.data._utils.collate as torch_collate

from pipeloom.compat import DataLoader
from tests.compat.compat_cases import same


class Box:
    """A type of the user's own, collated by a function registered in torch's map."""

    def __init__(self, value: int) -> None:
        self.value = value


def collate_boxes(batch, *, collate_fn_map=None):
    return ("boxes", [box.value for box in batch])


def float32_numbers(batch, *, collate_fn_map=None):
    return torch.tensor(batch, dtype=torch.float32)


class Boxes(tud.Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> dict:
        return {"box": Box(index), "x": index / 3, "t": torch.tensor([index])}


def batches(cls, num_workers):
    loader = cls(Boxes(), batch_size=4, num_workers=num_workers)
    return list(loader)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    "registered", [{Box: collate_boxes}, {Box: collate_boxes, float: float32_numbers}]
)
def test_collate_functions_registered_in_torchs_map_are_used_as_torch_uses_them(
    registered, num_workers
):
    # torch's default_collate looks its per-type functions up in
    # default_collate_fn_map at each batch, in its workers too; users register
    # their own types there (and replace float's to get float32 batches).
    saved = dict(torch_collate.default_collate_fn_map)
    torch_collate.default_collate_fn_map.update(registered)
    try:
        theirs = batches(tud.DataLoader, num_workers)
        ours = batches(DataLoader, num_workers)
    finally:
        torch_collate.default_collate_fn_map.clear()
        torch_collate.default_collate_fn_map.update(saved)
    assert (
        [b["box"] for b in ours]
        == [b["box"] for b in theirs]
        == [
            ("boxes", [0, 1, 2, 3]),
            ("boxes", [4, 5]),
        ]
    )
    for mine, torchs in zip(ours, theirs, strict=True):
        assert mine["x"].dtype == torchs["x"].dtype
        assert torch.equal(mine["x"], torchs["x"]) and torch.equal(mine["t"], torchs["t"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("samples", [[i / 3 for i in range(6)], [i % 2 == 0 for i in range(6)]])
def test_a_function_registered_for_plain_numbers_is_used_as_torch_uses_it(samples, num_workers):
    # a batch of plain Python numbers takes pipeloom's fast path, which must
    # step aside when torch would call the user's function (bool finds int's)
    def to_float32(batch, *, collate_fn_map=None):
        return torch.tensor(batch, dtype=torch.float32)

    saved = dict(torch_collate.default_collate_fn_map)
    torch_collate.default_collate_fn_map.update({float: to_float32, int: to_float32})
    try:
        theirs = list(tud.DataLoader(samples, batch_size=4, num_workers=num_workers))
        ours = list(DataLoader(samples, batch_size=4, num_workers=num_workers))
    finally:
        torch_collate.default_collate_fn_map.clear()
        torch_collate.default_collate_fn_map.update(saved)
    assert [b.dtype for b in ours] == [b.dtype for b in theirs] == [torch.float32] * 2
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_workers": np.int64(0)},
        {"num_workers": np.int64(2), "prefetch_factor": np.int64(3)},
        {"num_workers": np.int32(2), "worker_type": "thread"},
    ],
)
def test_numpy_integers_are_accepted_as_worker_counts_as_torch_accepts_them(kwargs):
    # a count read from a config or computed with NumPy is an np.int64
    with DataLoader(list(range(7)), batch_size=3, **kwargs) as loader:
        assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5], [6]]
        assert loader.num_workers == kwargs["num_workers"]


class StopsAtFive(tud.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        if index == 5:
            raise StopIteration  # torch's loader would end the epoch here, silently
        return index


def stop_at_four(batch):
    if 4 in batch:
        raise StopIteration
    return batch


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    "dataset, kwargs, before, where",
    [
        (StopsAtFive(), {"batch_size": 2}, 2, r"StopsAtFive\.__getitem__ raised StopIteration"),
        (StopsAtFive(), {"batch_size": None}, 5, r"StopsAtFive\.__getitem__ raised StopIteration"),
        (list(range(8)), {"batch_size": 2, "collate_fn": stop_at_four}, 2, "collate_fn raised"),
    ],
)
def test_stop_iteration_from_getitem_or_collate_fn_is_named_not_an_early_end(
    dataset, kwargs, before, where, num_workers
):
    # torch's loader yields the batches before it and ends the epoch without a
    # word; ours raises (documented), naming where it came from and torch's behaviour
    # (torch's workers, which the StopIteration leaves running, take 10 s to join when
    # their iterator is collected: its batches are the same without workers)
    theirs = list(tud.DataLoader(dataset, **kwargs))
    assert len(theirs) == before
    with DataLoader(dataset, num_workers=num_workers, **kwargs) as loader:
        epoch = iter(loader)
        assert all(same(next(epoch), batch) for batch in theirs)
        with pytest.raises(RuntimeError, match=where) as caught:
            next(epoch)
    assert "silently drops the batches after it" in str(caught.value)


class HoldsALock(tud.Dataset):
    def __init__(self) -> None:
        self.handle = threading.Lock()  # as an open file or database handle would be

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return index


@pytest.mark.timeout(60)
def test_a_dataset_that_cannot_go_to_spawned_workers_is_named_with_its_attribute():
    # torch says only "cannot pickle '_thread.lock' object"; ours named an internal
    # block. Now it names the attribute and the arguments that avoid pickling.
    loader = DataLoader(HoldsALock(), batch_size=2, num_workers=1, multiprocessing_context="spawn")
    with loader, pytest.raises(TypeError) as caught:
        list(loader)
    message = str(caught.value)
    assert "dataset.handle, a lock" in message and "_thread.lock" in message
    assert "multiprocessing_context='fork'" in message and "worker_type='thread'" in message


def shuffled_then_sharded():
    from torch.utils.data.datapipes.iter import IterableWrapper  # torch's (legacy) datapipes

    return IterableWrapper(range(12)).shuffle().sharding_filter()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_workers": 0},
        {"num_workers": 2},
        {"num_workers": 3, "persistent_workers": True},
        {"num_workers": 2, "multiprocessing_context": "spawn"},
    ],
)
def test_a_torch_datapipe_is_sharded_over_the_workers_and_shuffled_alike_as_torch_does(kwargs):
    # torch's loader applies a datapipe's sharding_filter() per worker and seeds its
    # shufflers with one seed shared by the workers; without that every worker read
    # every item (each item num_workers times), or a different shuffle each (items lost)
    with DataLoader(shuffled_then_sharded(), batch_size=None, **kwargs) as loader:
        epochs = [[int(x) for x in loader] for _ in range(2)]
    assert all(sorted(epoch) == list(range(12)) for epoch in epochs), epochs
    assert epochs[0] != epochs[1]  # each epoch its own shuffle, as with torch's loader
