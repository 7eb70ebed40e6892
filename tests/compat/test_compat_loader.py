"""len(), attributes, re-iteration and the defaults behave as torch's DataLoader."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.utils.data as tud

import pipeloom.compat
from pipeloom.compat import DataLoader, build_map_pipeline
from pipeloom.compat._engine import build_service
from pipeloom.compat._plan import EpochPlan, PlanBoard, PlanEntries
from pipeloom.reading_service import MultiProcessingReadingService
from tests.compat.compat_cases import Items, Range, same


def test_signature_accepts_every_torch_argument_with_torchs_defaults():
    theirs = inspect.signature(tud.DataLoader).parameters
    ours = inspect.signature(DataLoader).parameters
    for name, parameter in theirs.items():
        assert name in ours, name
        assert ours[name].default == parameter.default, name


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 3},
        {"batch_size": 3, "drop_last": True},
        {"batch_size": None},
        {"batch_sampler": tud.BatchSampler(range(10), 4, False)},
    ],
)
def test_len_and_attributes_match_torchs(kwargs):
    theirs, ours = tud.DataLoader(Items(10), **kwargs), DataLoader(Items(10), **kwargs)
    assert len(ours) == len(theirs)
    for name in ("batch_size", "drop_last", "num_workers", "prefetch_factor", "timeout"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert type(ours.sampler) is type(theirs.sampler)
    assert type(ours.batch_sampler) is type(theirs.batch_sampler)
    assert ours.dataset is not None and len(iter(ours)) == len(theirs)


@pytest.mark.parametrize("drop_last", [False, True])
def test_len_of_an_iterable_dataset_matches_torchs(drop_last):
    kwargs = {"batch_size": 4, "drop_last": drop_last}
    assert len(DataLoader(Range(0, 10), **kwargs)) == len(tud.DataLoader(Range(0, 10), **kwargs))


@pytest.mark.parametrize("num_workers, persistent", [(0, False), (2, False), (2, True)])
def test_iterating_twice_gives_two_epochs_like_torch(num_workers, persistent):
    def two_epochs(cls):
        torch.manual_seed(3)  # shuffle draws from torch's global RNG, as users do
        loader = cls(
            Items(8),
            batch_size=3,
            shuffle=True,
            num_workers=num_workers,
            persistent_workers=persistent,
        )
        return [list(loader), list(loader)]

    theirs, ours = two_epochs(tud.DataLoader), two_epochs(DataLoader)
    assert same(theirs, ours)
    assert not same(ours[0], ours[1])  # a new shuffle each epoch


def test_a_new_iterator_replaces_the_unfinished_one():
    loader = DataLoader(Items(6), batch_size=2, num_workers=2, persistent_workers=True)
    with loader:
        old = iter(loader)
        next(old)
        assert [b[0].tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]
        with pytest.raises(RuntimeError, match="no longer valid"):
            next(old)


def test_map_style_default_strategy_is_one_constant():
    assert DataLoader(Items(2), num_workers=1).strategy == pipeloom.compat.MAP_STYLE_STRATEGY
    assert DataLoader(Range(0, 2), num_workers=1).strategy == "classic"


def test_strategy_arguments_reach_the_service():
    loader = DataLoader(Items(8), batch_size=4, num_workers=2, strategy="chunked", chunk_size=2)
    assert loader._strategy_kwargs == {"strategy": "chunked", "chunk_size": 2}
    service = build_service(loader)
    assert (service.strategy, service.chunk_size) == ("chunked", 2)
    assert len(list(loader)) == 2


@pytest.mark.parametrize("service", ["in-process", "threads", "processes"])
def test_the_per_item_pipeline_shape_batches_as_the_batch_sampler(service):
    from pipeloom import DataLoader as Engine
    from pipeloom.reading_service import InProcessReadingService, ThreadReadingService

    board = PlanBoard()
    services = {
        "in-process": InProcessReadingService,
        "threads": lambda: ThreadReadingService(2),
        "processes": lambda: MultiProcessingReadingService(2, start_method="fork"),
    }
    sampler = tud.BatchSampler(tud.RandomSampler(range(11)), 3, drop_last=True)
    entries = PlanEntries.from_outputs(list(sampler))
    board.publish(EpochPlan(entries, base_seed=0))
    expected = [torch.utils.data.default_collate([Items(11)[i] for i in b]) for b in entries]
    pipe = build_map_pipeline(
        board,
        Items(11),
        torch.utils.data.default_collate,
        auto_collation=True,
        per_item_batch=(3, True),
    )
    with Engine(pipe, services[service](), seed=0) as engine:
        assert same(list(engine), expected)
