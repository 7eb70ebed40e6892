"""torch's signature on two engines: pipeloom.compat.DataLoader vs torch's DataLoader.

    python benchmarks/bench_compat.py [--quick] [--sampler endless]

A map-style dataset of ``n`` items of 64 KiB (16384 float32) each; item
``i`` is built from its own seed and then gets ``work`` rounds of per-item
CPU work (elementwise torch ops). ``batch_size=64``, ``shuffle=True`` with a
seeded generator (or ``--sampler endless``: a sampler with no end, read for as
many batches), ``num_workers`` 0, 2 and 4 -- the same arguments to both
loaders, which is the point of the compat loader. Each run is one epoch on a
fresh loader (worker start-up included).

Per loader the table gives the median wall time and throughput (items/s),
torch's time over ours (> 1: pipeloom is faster), and the peak shared memory
seen while the epoch ran, sampled every 2 ms by a thread: ``Shmem`` from
``/proc/meminfo`` (all shared memory, including memfd-backed queues that
``/dev/shm`` does not show) and the bytes used in ``/dev/shm``, both above
their level before the run. The batches of both loaders are checked to be
identical.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.data
from _common import print_table

import pipeloom.compat

ITEM_FLOATS = 16384  # 64 KiB of float32


class HeavyItems(torch.utils.data.Dataset):
    """Item ``i``: 64 KiB of floats from seed ``i``, after ``work`` rounds of CPU work."""

    def __init__(self, n: int, work: int) -> None:
        self.n, self.work = n, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x = torch.rand(ITEM_FLOATS, generator=torch.Generator().manual_seed(index))
        for _ in range(self.work):
            x = torch.tanh(x * 1.5 + 0.1)
        return x, index


def read_shmem_bytes() -> int:
    """``Shmem`` in /proc/meminfo (kB -> bytes); 0 where there is no /proc."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("Shmem:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def read_dev_shm_bytes() -> int:
    """Bytes used in /dev/shm (statvfs), 0 where it does not exist."""
    try:
        stats = os.statvfs("/dev/shm")
    except OSError:
        return 0
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


class PeakSampler:
    """Samples shared-memory use in a thread; ``peaks()`` above the level at start."""

    def __init__(self, period: float = 0.002) -> None:
        self.period = period
        self._stop = threading.Event()
        self._base = (read_shmem_bytes(), read_dev_shm_bytes())
        self._peak = self._base
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            shmem, dev_shm = read_shmem_bytes(), read_dev_shm_bytes()
            self._peak = (max(self._peak[0], shmem), max(self._peak[1], dev_shm))

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def peaks(self) -> tuple[int, int]:
        return self._peak[0] - self._base[0], self._peak[1] - self._base[1]


class Endless(torch.utils.data.Sampler):
    """Permutation after permutation from its own generator, with no end and no ``__len__``
    (as detectron2's ``TrainingSampler``): the loader draws it as the epoch goes."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self):
        generator = torch.Generator().manual_seed(0)
        while True:
            yield from torch.randperm(self.size, generator=generator).tolist()


def one_epoch(
    loader_class: Callable[..., Any], dataset: HeavyItems, workers: int, endless: bool = False
) -> Any:
    sampling: dict[str, Any] = (
        {"sampler": Endless(len(dataset))}
        if endless
        else {"shuffle": True, "generator": torch.Generator().manual_seed(0)}
    )
    loader = loader_class(dataset, batch_size=64, num_workers=workers, **sampling)
    batches = itertools.islice(loader, len(dataset) // 64)  # an endless one: as many
    checksum = [batch[1].sum().item() + float(batch[0][:, 0].sum()) for batch in batches]
    del batches  # an endless epoch's iterator, with its workers: gone before the next loader
    gc.collect()
    if hasattr(loader, "shutdown"):
        loader.shutdown()
    return checksum


def measure(loader_class, dataset, workers, repeats, endless) -> tuple[float, int, int, Any]:
    times, shmem, dev_shm, checksum = [], 0, 0, None
    for _ in range(repeats):
        with PeakSampler() as sampler:
            start = time.perf_counter()
            checksum = one_epoch(loader_class, dataset, workers, endless)
            times.append(time.perf_counter() - start)
        peak = sampler.peaks()
        shmem, dev_shm = max(shmem, peak[0]), max(dev_shm, peak[1])
    return statistics.median(times), shmem, dev_shm, checksum


def mib(value: int) -> str:
    return f"{value / 2**20:.1f}"


def main(argv: list[str] | None = None) -> list[list[Any]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer items and repeats")
    parser.add_argument(
        "--sampler",
        choices=("shuffle", "endless"),
        default="shuffle",
        help="shuffle=True, or an endless sampler read for as many batches",
    )
    args = parser.parse_args(argv)
    endless = args.sampler == "endless"
    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
    n, work, repeats = (640, 4, 1) if args.quick else (2560, 8, 3)
    dataset = HeavyItems(n, work)
    rows = []
    for workers in (0, 2, 4):
        results = {}
        for name, loader_class in (
            ("torch", torch.utils.data.DataLoader),
            ("pipeloom.compat", pipeloom.compat.DataLoader),
        ):
            results[name] = measure(loader_class, dataset, workers, repeats, endless)
        if results["torch"][3] != results["pipeloom.compat"][3]:
            raise SystemExit(f"the loaders' batches differ at num_workers={workers}")
        torch_time = results["torch"][0]
        for name, (wall, shmem, dev_shm, _) in results.items():
            rows.append(
                [
                    workers,
                    name,
                    f"{wall:.2f}",
                    f"{n / wall:.0f}",
                    f"{torch_time / wall:.2f}",
                    mib(shmem),
                    mib(dev_shm),
                ]
            )
    print_table(
        f"torch's signature: {n} items of 64 KiB, {work} rounds of CPU work per item, "
        f"batch 64, {args.sampler}, one epoch per fresh loader, median of {repeats}",
        [
            "workers",
            "loader",
            "wall s",
            "items/s",
            "torch time / ours",
            "peak Shmem MiB",
            "peak /dev/shm MiB",
        ],
        rows,
    )
    return rows


if __name__ == "__main__":
    main()
