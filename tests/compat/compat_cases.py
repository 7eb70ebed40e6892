"""Datasets, samplers and a comparison helper shared by the compat tests.

Each case builds *fresh* arguments for one loader (samplers hold generators,
so torch's loader and ours must each get their own, seeded alike).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.data as tud
from hypothesis import strategies as st

Kwargs = Callable[[], dict[str, Any]]


class Items(tud.Dataset):
    """Item ``i``: an int, a float tensor and a string (three collate paths)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, str]:
        return index, torch.tensor([index, index * index], dtype=torch.float32), f"s{index}"


class BatchedItems(Items):
    """Has ``__getitems__``, which torch's fetcher prefers (and so must we)."""

    def __getitems__(self, indices: list[int]) -> list[tuple[int, int]]:
        return [(i, -len(indices)) for i in indices]


class WorkerAware(Items):
    """Item ``i`` records torch's worker info and draws from the worker's global RNG."""

    def __getitem__(self, index: int) -> dict[str, Any]:
        info = tud.get_worker_info()
        return {
            "index": index,
            "worker": -1 if info is None else info.id,
            "workers": 0 if info is None else info.num_workers,
            "seed": -1 if info is None else info.seed,
            "same_dataset": info is None or isinstance(info.dataset, WorkerAware),
            "torch": torch.rand(()),
        }


class Range(tud.IterableDataset):
    """torch's documented ``get_worker_info()`` sharding idiom."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __iter__(self):
        info = tud.get_worker_info()
        if info is None:
            return iter(range(self.start, self.end))
        per_worker = int(math.ceil((self.end - self.start) / float(info.num_workers)))
        begin = self.start + info.id * per_worker
        return iter(range(begin, min(begin + per_worker, self.end)))

    def __len__(self) -> int:
        return self.end - self.start


class Unsharded(tud.IterableDataset):
    """Sharded by ``shard_by_worker_init`` instead (torch's ``worker_init_fn`` idiom)."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __iter__(self):
        return iter((i, float(torch.rand(()))) for i in range(self.start, self.end))


def shard_by_worker_init(worker_id: int) -> None:
    info = tud.get_worker_info()
    dataset = info.dataset
    overall_start, overall_end = dataset.start, dataset.end
    per_worker = int(math.ceil((overall_end - overall_start) / float(info.num_workers)))
    dataset.start = overall_start + worker_id * per_worker
    dataset.end = min(dataset.start + per_worker, overall_end)


def pairs_collate(batch: list[Any]) -> list[Any]:
    """A custom collate_fn: keeps the samples, adds the batch length."""
    return [len(batch), [sample[0] for sample in batch]]


def same(a: Any, b: Any) -> bool:
    """Deep equality with tensors compared by dtype, shape and value."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@st.composite
def sampling(draw: st.DrawFn, n: int) -> tuple[str, Kwargs]:
    """A sampling setup for a dataset of ``n`` items: (name, fresh kwargs factory)."""
    kind = draw(
        st.sampled_from(
            [
                "sequential",
                "shuffle",
                "random_replacement",
                "random_num_samples",
                "subset",
                "weighted",
                "batch_sampler",
                "distributed",
            ]
        )
    )
    seeded = draw(st.booleans())  # a generator, or torch's global RNG
    seed = draw(st.integers(0, 2**31))
    batch_size = draw(st.one_of(st.none(), st.integers(1, 5)))
    drop_last = batch_size is not None and draw(st.booleans())
    num_samples = draw(st.integers(1, 2 * n + 40))
    subset = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n))
    weights = draw(st.lists(st.floats(0.1, 5.0), min_size=n, max_size=n))
    replacement = draw(st.booleans())
    rank = draw(st.integers(0, 1))

    def make() -> dict[str, Any]:
        generator = torch.Generator().manual_seed(seed) if seeded else None
        own = torch.Generator().manual_seed(seed + 1) if seeded else None
        kwargs: dict[str, Any] = {"batch_size": batch_size, "drop_last": drop_last}
        if generator is not None:
            kwargs["generator"] = generator
        if kind == "shuffle":
            kwargs["shuffle"] = True
        elif kind == "random_replacement":
            kwargs["sampler"] = tud.RandomSampler(range(n), replacement=True, generator=own)
        elif kind == "random_num_samples":
            kwargs["sampler"] = tud.RandomSampler(
                range(n), replacement=replacement, num_samples=num_samples, generator=own
            )
        elif kind == "subset":
            kwargs["sampler"] = tud.SubsetRandomSampler(subset, generator=own)
        elif kind == "weighted":
            count = num_samples if replacement else min(num_samples, n)
            kwargs["sampler"] = tud.WeightedRandomSampler(
                weights, count, replacement=replacement, generator=own
            )
        elif kind == "batch_sampler":
            sampler = tud.RandomSampler(range(n), generator=own)
            kwargs = {"batch_sampler": tud.BatchSampler(sampler, batch_size or 3, drop_last)}
            if generator is not None:
                kwargs["generator"] = generator
        elif kind == "distributed":
            kwargs["sampler"] = tud.distributed.DistributedSampler(
                range(n), num_replicas=2, rank=rank, shuffle=True, seed=seed
            )
        return kwargs

    return f"{kind}(seeded={seeded}, batch_size={batch_size}, drop_last={drop_last})", make


def epochs(loader: Any, count: int = 2) -> list[list[Any]]:
    """``count`` epochs of a loader, set_epoch'ing a DistributedSampler as users do."""
    out = []
    for epoch in range(count):
        set_epoch = getattr(loader.sampler, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)
        out.append(list(loader))
    return out


def run_both(
    dataset: Any,
    make: Kwargs,
    *,
    seed: int = 0,
    count: int = 2,
    common: dict[str, Any] | None = None,
    ours: dict[str, Any] | None = None,
) -> tuple[Any, Any]:
    """The same epochs from torch's loader and ours, and the global RNG draw after each.

    ``common`` goes to both loaders, ``ours`` (e.g. ``strategy``) only to ours.
    """
    from pipeloom.compat import DataLoader

    results = []
    for cls, extra in ((tud.DataLoader, {}), (DataLoader, ours or {})):
        torch.manual_seed(seed)
        loader = cls(dataset, **make(), **(common or {}), **extra)
        try:
            results.append((epochs(loader, count), float(torch.rand(()))))
        finally:
            if hasattr(loader, "shutdown"):
                loader.shutdown()
    return results[0], results[1]
