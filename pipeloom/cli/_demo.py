"""``python -m pipeloom demo``: the same tar shards read every way, next to torch's loader.

It writes small WebDataset-style shards (``000000.png``-like pairs: a raw
64x64 image and its class) in a temporary directory, then reads them
in-process, with worker threads, with each process strategy, and with
``torch.utils.data.DataLoader`` over a map-style dataset of the same
members, and prints, side by side: throughput, time to the first batch,
peak shared memory of this process tree (resident, sampled every 50 ms), and whether the batches are
identical to the in-process ones. Nothing leaves the machine.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.data

from ..autotune import AutoReadingService
from ..datapipes import FileLister, IterableWrapper, IterDataPipe
from ..loader import DataLoader
from ..reading_service import MultiProcessingReadingService, ThreadReadingService
from ..stats import shared_memory_in_use

__all__ = ["demo"]

SIDE = 64  # pixels per image side


@dataclass(frozen=True)
class Size:
    shards: int
    samples: int  # per shard
    batch: int
    workers: int


QUICK = Size(shards=4, samples=32, batch=16, workers=2)
FULL = Size(shards=8, samples=256, batch=32, workers=2)


def write_shards(root: str, size: Size) -> list[str]:
    """``size.shards`` tar files of ``size.samples`` samples (``.raw`` image, ``.cls``)."""
    generator = torch.Generator().manual_seed(0)
    paths = []
    for shard in range(size.shards):
        path = os.path.join(root, f"shard-{shard:04d}.tar")
        with tarfile.open(path, "w") as tar:
            for i in range(size.samples):
                key = f"{shard:04d}{i:06d}"
                image = torch.randint(
                    0, 256, (SIDE * SIDE,), dtype=torch.uint8, generator=generator
                )
                label = str((shard * size.samples + i) % 10).encode()
                for ext, data in (("raw", image.numpy().tobytes()), ("cls", label)):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def decode(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
    """A sample's image as normalised floats, and its class."""
    pixels = torch.frombuffer(bytearray(sample["raw"]), dtype=torch.uint8)
    image = pixels.view(1, SIDE, SIDE).float().div_(255.0)
    image = (image - image.mean()) / (image.std() + 1e-6)
    return image, int(sample["cls"])


def collate(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = zip(*batch, strict=True)
    return torch.stack(images), torch.tensor(labels)


def by_shard(root: str, batch: int) -> IterDataPipe:
    """Workers split the shards: each reads whole tar files."""
    return (
        FileLister(root, "*.tar")
        .sharding_filter()
        .open_files("b")
        .load_from_tar()
        .webdataset()
        .map(decode)
        .batch(batch)
        .collate(collate)
    )


class TarMembers(torch.utils.data.Dataset):
    """torch's side: a map-style dataset of the same samples, read by seeking into the tars."""

    def __init__(self, paths: list[str]) -> None:
        self.index: list[tuple[str, int, int, int, int]] = []
        for path in paths:
            with tarfile.open(path) as tar:
                members = tar.getmembers()
            for raw, cls in zip(members[0::2], members[1::2], strict=True):
                self.index.append((path, raw.offset_data, raw.size, cls.offset_data, cls.size))

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, raw_at, raw_size, cls_at, cls_size = self.index[i]
        with open(path, "rb") as f:
            f.seek(raw_at)
            raw = f.read(raw_size)
            f.seek(cls_at)
            cls = f.read(cls_size)
        return decode({"raw": raw, "cls": cls})


def by_index(dataset: TarMembers, batch: int) -> IterDataPipe:
    """Workers read single samples by seeking into the tars (economic's shape: one to one)."""
    return (
        IterableWrapper(range(len(dataset)))
        .sharding_filter()
        .map(dataset.__getitem__)
        .batch(batch)
        .collate(collate)
    )


@dataclass
class Row:
    name: str
    items_per_s: float
    first_batch_s: float
    peak_shm_mib: float
    identical: bool | None


def measure(name: str, make: Callable[[], Iterable[Any]], reference: list[Any] | None) -> Row:
    """Build the loader, read one epoch; the figures, and the batches compared."""
    started = time.perf_counter()
    loader = make()
    batches: list[Any] = []
    first = 0.0
    peak = shared_memory_in_use()
    checked = started
    items = 0
    try:
        for batch in loader:
            if not batches:
                first = time.perf_counter() - started
            batches.append(batch)
            items += len(batch[1])
            if time.perf_counter() - checked >= 0.05:
                checked = time.perf_counter()
                peak = max(peak, shared_memory_in_use())
    finally:
        shutdown = getattr(loader, "shutdown", None)
        if shutdown is not None:
            shutdown()
    elapsed = time.perf_counter() - started
    identical = None if reference is None else _same(batches, reference)
    return Row(name, items / elapsed, first, peak / 2**20, identical)


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b, strict=True)
    )


def _processes(
    root: str, dataset: TarMembers, size: Size, strategy: str
) -> Callable[[], Iterable[Any]]:
    def make() -> DataLoader:
        pipe = (
            by_index(dataset, size.batch) if strategy == "economic" else by_shard(root, size.batch)
        )
        service = MultiProcessingReadingService(size.workers, strategy=strategy)
        return DataLoader(pipe, service, seed=0)

    return make


def _torch(dataset: TarMembers, size: Size, workers: int) -> Callable[[], Iterable[Any]]:
    def make() -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(
            dataset, batch_size=size.batch, collate_fn=collate, num_workers=workers
        )

    return make


def demo(*, quick: bool) -> int:
    """The ``demo`` command; returns the exit status."""
    size = QUICK if quick else FULL
    n = size.workers
    with tempfile.TemporaryDirectory(prefix="pipeloom-demo-") as root:
        paths = write_shards(root, size)
        total = size.shards * size.samples
        print(
            f"{size.shards} WebDataset-style tar shards of {size.samples} samples "
            f"({SIDE}x{SIDE} image + class) in {root}; batches of {size.batch}, {n} workers"
        )
        reference = list(DataLoader(by_shard(root, size.batch), seed=0))
        dataset = TarMembers(paths)
        runs: list[tuple[str, Callable[[], Iterable[Any]]]] = [
            ("pipeloom in-process", lambda: DataLoader(by_shard(root, size.batch), seed=0)),
            (
                f"pipeloom threads ({n})",
                lambda: DataLoader(by_shard(root, size.batch), ThreadReadingService(n), seed=0),
            ),
        ]
        for strategy in ("classic", "economic", "chunked"):
            runs.append((f"pipeloom {strategy} ({n})", _processes(root, dataset, size, strategy)))
        auto = AutoReadingService()
        runs.append(
            ("pipeloom autotuned", lambda: DataLoader(by_shard(root, size.batch), auto, seed=0))
        )
        for workers in (0, n):
            runs.append((f"torch DataLoader ({workers})", _torch(dataset, size, workers)))
        rows = [measure(name, make, reference) for name, make in runs]
    print(f"{'loader (workers)':<26} {'items/s':>9} {'first batch':>12} {'peak shm':>10}  same")
    for row in rows:
        same = {True: "yes", False: "NO", None: "-"}[row.identical]
        print(
            f"{row.name:<26} {row.items_per_s:>9,.0f} {row.first_batch_s * 1000:>9.0f} ms "
            f"{row.peak_shm_mib:>6.1f} MiB  {same}"
        )
    print(
        f"{total} items per run; items/s over the whole epoch, start-up included; "
        f"'same': batches identical to pipeloom in-process (economic's workers, like torch's "
        f"dataset, read samples by seeking into the tars; the other pipelines split the shards)"
    )
    report = auto.autotune_report()
    print(
        f"autotuned (DataLoader(pipe, 'auto')): ended on {report['chosen']} after "
        f"{len(report['trials'])} measured window(s), {report['replacements']} re-placement(s) "
        f"mid-epoch; it starts with one thread per core, so a short epoch leaves it little time"
    )
    identical = all(row.identical for row in rows)
    print("identical output everywhere: " + ("yes" if identical else "NO"))
    return 0 if identical else 1
