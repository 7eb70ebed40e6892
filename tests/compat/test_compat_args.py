"""Every argument error torch's DataLoader raises, ours raises too, with a clearer message."""

from __future__ import annotations

import pytest
import torch
import torch.utils.data as tud

from pipeloom.compat import DataLoader
from tests.compat.compat_cases import Items, Range

SAMPLER = tud.SequentialSampler(range(4))
BATCHES = tud.BatchSampler(SAMPLER, 2, False)

# (dataset, kwargs, the words our message must contain)
TORCH_ERRORS = [
    (Items(4), {"num_workers": -1}, r"num_workers must be an int >= 0, got -1; use num_workers=0"),
    (Items(4), {"timeout": -1}, r"timeout must be a number of seconds >= 0, got -1"),
    (Items(4), {"prefetch_factor": 2}, r"prefetch_factor=2 .* num_workers=0 starts no worker"),
    (Items(4), {"num_workers": 1, "prefetch_factor": -1}, r"prefetch_factor must be an int >= 1"),
    (Items(4), {"persistent_workers": True}, r"persistent_workers=True .* num_workers=0"),
    (Items(4), {"multiprocessing_context": "spawn"}, r"num_workers=0 starts none"),
    (Items(4), {"num_workers": 1, "multiprocessing_context": "nope"}, r"a start method in"),
    (Range(0, 4), {"shuffle": True}, r"shuffle=True cannot reorder an IterableDataset"),
    (Range(0, 4), {"sampler": SAMPLER}, r"sampler=.* cannot pick items of an IterableDataset"),
    (Range(0, 4), {"batch_sampler": BATCHES}, r"batch_sampler=.* IterableDataset"),
    (Items(4), {"sampler": SAMPLER, "shuffle": True}, r"sampler and shuffle=True both decide"),
    (Items(4), {"batch_sampler": BATCHES, "batch_size": 2}, r"mutually exclusive.*got batch_size"),
    (Items(4), {"batch_sampler": BATCHES, "shuffle": True}, r"got shuffle"),
    (Items(4), {"batch_sampler": BATCHES, "sampler": SAMPLER}, r"got sampler"),
    (Items(4), {"batch_sampler": BATCHES, "drop_last": True}, r"got drop_last"),
    (Items(4), {"batch_size": None, "drop_last": True}, r"batch_size=None turns off batching"),
    (Items(4), {"batch_size": 0}, r"batch_size should be a positive integer"),
]


@pytest.mark.parametrize(("dataset", "kwargs", "message"), TORCH_ERRORS)
def test_argument_errors_torch_raises_are_raised_here_too(dataset, kwargs, message):
    with pytest.raises((ValueError, TypeError)):
        tud.DataLoader(dataset, **kwargs)
    with pytest.raises((ValueError, TypeError), match=message):
        DataLoader(dataset, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout": 5}, r"timeout=5 bounds the wait for a worker, but num_workers=0"),
        ({"num_workers": 1, "prefetch_factor": 0}, r"prefetch_factor must be an int >= 1"),
        ({"generator": 3}, r"generator must be a torch.Generator or None, got int"),
        ({"worker_init_fn": 3, "num_workers": 1}, r"worker_init_fn must be a callable"),
        ({"worker_type": "fiber"}, r"worker_type must be one of"),
        ({"strategy": "fast"}, r"strategy must be one of"),
        ({"strategy": "economic"}, r"strategy='economic' .* leave strategy unset"),
        (
            {"num_workers": 2, "worker_type": "thread", "worker_init_fn": print},
            r"worker_init_fn applies to worker processes",
        ),
    ],
)
def test_errors_torch_finds_late_or_never_are_raised_at_construction(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        DataLoader(Items(4), **kwargs)


def test_iterable_datasets_refuse_threads_and_other_strategies():
    with pytest.raises(ValueError, match="get_worker_info\\(\\), which is per process"):
        DataLoader(Range(0, 4), num_workers=2, worker_type="thread")
    with pytest.raises(ValueError, match="an IterableDataset is read whole by each worker"):
        DataLoader(Range(0, 4), num_workers=2, strategy="economic")


def test_frozen_attributes_cannot_be_set_after_construction_as_in_torch():
    loader = DataLoader(Items(4), batch_size=2)
    with pytest.raises(ValueError, match="batch_size cannot be changed after"):
        loader.batch_size = 3
    torch_loader = tud.DataLoader(Items(4), batch_size=2)
    with pytest.raises(ValueError):
        torch_loader.batch_size = 3
    loader.num_workers = 0  # not frozen in torch either


def test_a_context_object_is_accepted_like_a_start_method_name():
    import multiprocessing

    loader = DataLoader(
        Items(4), num_workers=1, multiprocessing_context=multiprocessing.get_context("fork")
    )
    assert [b[0].tolist() for b in loader] == [[0], [1], [2], [3]]
    loader.shutdown()
    assert torch.initial_seed() is not None


@pytest.mark.timeout(60)
def test_truthy_flags_are_accepted_as_torch_accepts_them():
    # pipeloom's own services refuse non-bools; the drop-in passes torch's meaning on
    loader = DataLoader(list(range(8)), batch_size=4, num_workers=2, persistent_workers=1)
    try:
        assert [batch.tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    finally:
        loader.shutdown()


@pytest.mark.parametrize(
    ("name", "value"),
    [("collate_fn", list), ("num_workers", 2), ("worker_init_fn", print), ("pin_memory", True)],
)
def test_an_argument_torch_reads_again_at_each_iter_cannot_be_changed_silently(name, value):
    # torch's next iter() would use the new value; ours built its pipeline from the first
    loader = DataLoader(Items(4), batch_size=2)
    list(loader)
    with pytest.raises(ValueError, match=f"{name} cannot be changed after.*would be ignored"):
        setattr(loader, name, value)
    setattr(loader, name, getattr(loader, name))  # the same value is no change
    loader.shutdown()


@pytest.mark.parametrize("batch_size", [2, None])
def test_the_default_collate_fn_shown_is_torchs(batch_size):
    ours = DataLoader(Items(4), batch_size=batch_size)
    assert ours.collate_fn is tud.DataLoader(Items(4), batch_size=batch_size).collate_fn
