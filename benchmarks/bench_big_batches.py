"""Big batches: peak shared memory and throughput on 128 MiB batches, pipeloom vs torch, one run.

    python benchmarks/bench_big_batches.py [--quick] [--stall SECONDS]

Issue #16's big-batch table. Items of 8 MiB (a float32 tensor filled with
its index), batch 16 (128 MiB batches), ``prefetch_factor=2``, at 1, 2, 4 and
8 workers; loaders: torch's ``DataLoader``, pipeloom ``strategy="classic"``,
``"economic"`` and ``"chunked"`` over
``SequenceWrapper(range(n)).to_iter().map(make_item).batch(16).collate()``,
and ``pipeloom.compat.DataLoader`` with torch's arguments.

1. **Memory**: a consumer that takes the first batch and stalls ``--stall``
   seconds (5; ``--quick``: 1) holding it, then drains the rest, so every
   loader fills all its buffers. Sampled as in ``bench_memory.py`` (which this
   reuses; it has the steady slow consumer instead): the peak of the
   system-wide ``Shmem`` of /proc/meminfo above a baseline taken before the
   loader is built (it counts pipeloom's memfd segments and torch's /dev/shm
   storages alike), /dev/shm alone, and the process tree's USS/PSS/RSS via
   psutil when installed. A fresh loader per run, the least Shmem peak of the
   repeats; batches checked.
2. **Throughput**, loader-bound: the same items with no consumer sleep,
   persistent workers, the second epoch timed (the first starts the workers
   and warms the buffers), median of the repeats, at 2, 4 and 8 workers, as
   batches/s and a ratio to torch's (> 1: faster).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch.utils.data
from _common import note, print_table, quiet_torch_warnings, shutdown
from bench_memory import (
    BATCH,
    BATCH_BYTES,
    ITEM_NUMEL,
    MEMORY_NOTE,
    MIB,
    PREFETCH,
    STRATEGIES,
    Items,
    make_item,
    makers,
    memory_header,
    memory_rows,
    psutil,
)

import pipeloom
import pipeloom.compat
from pipeloom.datapipes import SequenceWrapper
from pipeloom.reading_service import MultiProcessingReadingService


def stall_after_first(stall: float) -> Callable[[int], float]:
    """A consumer that holds the first batch ``stall`` seconds and the others not at all."""
    return lambda index: stall if index == 0 else 0.0


def throughput_loaders(n: int, workers: int) -> dict[str, Callable[[], Any]]:
    """Persistent-worker loaders over ``n`` 8 MiB items, torch's first."""

    def torch_one() -> Any:
        return torch.utils.data.DataLoader(
            Items(n),
            batch_size=BATCH,
            num_workers=workers,
            prefetch_factor=PREFETCH,
            persistent_workers=True,
        )

    def ours(strategy: str) -> Callable[[], Any]:
        def make() -> Any:
            pipe = SequenceWrapper(range(n)).to_iter().map(make_item).batch(BATCH).collate()
            service = MultiProcessingReadingService(
                workers, prefetch_factor=PREFETCH, strategy=strategy, persistent_workers=True
            )
            return pipeloom.DataLoader(pipe, service, seed=0)

        return make

    def compat() -> Any:
        return pipeloom.compat.DataLoader(
            Items(n),
            batch_size=BATCH,
            num_workers=workers,
            prefetch_factor=PREFETCH,
            persistent_workers=True,
        )

    return {
        "torch": torch_one,
        **{f"pipeloom {s}": ours(s) for s in STRATEGIES},
        "pipeloom.compat": compat,
    }


def throughput_rows(worker_counts: tuple[int, ...], n: int, repeats: int) -> list[list[Any]]:
    """Loader-bound batches/s on 128 MiB batches, second epoch of persistent workers."""
    rows = []
    for workers in worker_counts:
        loaders = throughput_loaders(n, workers)
        speeds: dict[str, list[float]] = {name: [] for name in loaders}
        for _ in range(repeats):  # round-robin, so drift in machine load hits every loader alike
            for name, make in loaders.items():
                loader = make()
                sum(1 for _ in loader)  # start the workers, warm the buffers
                start = time.perf_counter()
                batches = sum(1 for _ in loader)
                speeds[name].append(batches / (time.perf_counter() - start))
                shutdown(loader)
                del loader
        torch_speed = statistics.median(speeds["torch"])
        for name, values in speeds.items():
            speed = statistics.median(values)
            ratio = "" if name == "torch" else f"{speed / torch_speed:.2f}x"
            rows.append([workers, name, f"{speed:.2f}", f"{speed * BATCH_BYTES / MIB:.0f}", ratio])
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2 workers, 1 s stall, 1 run")
    parser.add_argument("--stall", type=float, help="consumer stall after the first batch (5 s)")
    parser.add_argument("--repeats", type=int, help="runs per case (memory: least peak kept)")
    parser.add_argument("--interval", type=float, default=0.01, help="sampling period, seconds")
    parser.add_argument("--workers", type=int, nargs="+", help="worker counts (1 2 4 8)")
    args = parser.parse_args(argv)
    quiet_torch_warnings()
    if args.quick:  # a smoke run
        memory_workers, speed_workers, n_speed, repeats, stall = (2,), (2,), 32, 1, 1.0
    else:
        memory_workers, speed_workers, n_speed, repeats = (1, 2, 4, 8), (2, 4, 8), 192, 2
        stall = 5.0
    repeats = args.repeats or repeats
    stall = stall if args.stall is None else args.stall
    if args.workers:
        memory_workers = speed_workers = tuple(args.workers)
    if psutil is None:
        note("psutil is not installed (pip install psutil): no process-tree columns")

    rows, _ = memory_rows(
        memory_workers,
        lambda n, workers: makers(n, workers, STRATEGIES, compat=True),
        stall_after_first(stall),
        repeats,
        args.interval,
        quick=args.quick,
        # the stall lets every loader fill its buffers (about w x prefetch batches, classic
        # a few more): that many batches and a few to spare show the peak
        batches_for=lambda workers: workers * PREFETCH + (4 if args.quick else 6),
    )
    print_table(
        f"big batches, peak memory above baseline: items of {ITEM_NUMEL * 4 // MIB} MiB, batch "
        f"{BATCH} (= {BATCH_BYTES // MIB} MiB), prefetch_factor {PREFETCH}, consumer stalls "
        f"{stall:g} s after the first batch, sampled every {args.interval * 1e3:g} ms, least "
        f"Shmem peak of {repeats} run(s)",
        memory_header(),
        rows,
    )
    note(MEMORY_NOTE)
    print_table(
        f"big batches, throughput: {n_speed} items of {ITEM_NUMEL * 4 // MIB} MiB, batch {BATCH}, "
        f"no consumer sleep, persistent workers, second epoch, median of {repeats}",
        ["workers", "loader", "batches/s", "MiB/s", "vs torch"],
        throughput_rows(speed_workers, n_speed, repeats),
    )


if __name__ == "__main__":
    main()
