"""Start-up under spawn: time to the first batch for a dataset holding N MiB of strings, one run.

    python benchmarks/bench_spawn_start.py [--quick]

Issue #16's spawn table. A map-style dataset holding N MiB of Python strings
(16, 32, 64 and 128 MiB of 128-character strings, the shape of a file list or
a caption table), ``start_method="spawn"``, 2 and 4 workers, persistent
workers, batch 64; each epoch reads the first 1,024 indices (16 batches), so
the figures are about start-up, not the epoch. Loaders:

- torch: ``DataLoader(dataset, batch_size=64, sampler=range(1024), num_workers=w,
  multiprocessing_context="spawn", persistent_workers=True)``;
- pipeloom classic: ``IterableWrapper(range(1024)).sharding_filter()
  .map(dataset.__getitem__).batch(64).collate()`` under
  ``MultiProcessingReadingService(w, start_method="spawn", persistent_workers=True)``;
- the same with ``warm_start=True``: the main process's threads make the
  first batches while the worker processes start;
- ``pipeloom.compat.DataLoader`` with torch's arguments.

pipeloom spawns through its start server (``PIPELOOM_SPAWN_SERVER=0``:
``multiprocessing``'s plain spawn, the figures before it): the process's first
pipeloom loader starts the server (noted below the table), later ones reuse it.

Per loader, the median over the repeats (a fresh loader each) of: the time
from building the loader to the first batch (the dataset reaches every
worker in it), the first epoch's wall time, and the time from ``iter()`` to the
first batch of the second epoch (persistent workers: nothing should be
re-sent). Ratios are torch's time over the loader's (> 1: sooner than torch).
Batches are checked equal to torch's.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import time
from typing import Any

import torch
import torch.utils.data
from _common import Clock, note, print_table, quiet_torch_warnings, run_epoch, shutdown

import pipeloom
import pipeloom.compat
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import MultiProcessingReadingService

MIB = 1 << 20
STRING_CHARS = 128
BATCH = 64
READ = 1024  # indices read per epoch
PAD = "x" * (STRING_CHARS - 12)


class Strings(torch.utils.data.Dataset):
    """``mib`` MiB of Python strings of 128 characters; item ``i`` is ``(i, len(string i))``."""

    def __init__(self, mib: int) -> None:
        self.strings = [f"{i:012d}{PAD}" for i in range(mib * MIB // STRING_CHARS)]

    def __len__(self) -> int:
        return len(self.strings)

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, len(self.strings[index])


def loaders(dataset: Strings, workers: int):
    torch_args: dict[str, Any] = dict(
        batch_size=BATCH,
        sampler=range(READ),
        num_workers=workers,
        multiprocessing_context="spawn",
        persistent_workers=True,
    )
    yield "torch", lambda: torch.utils.data.DataLoader(dataset, **torch_args)

    def classic(warm_start: bool) -> pipeloom.DataLoader:
        pipe = IterableWrapper(range(READ)).sharding_filter().map(dataset.__getitem__)
        service = MultiProcessingReadingService(
            workers, start_method="spawn", persistent_workers=True, warm_start=warm_start
        )
        return pipeloom.DataLoader(pipe.batch(BATCH).collate(), service, seed=0)

    yield "pipeloom classic", lambda: classic(False)
    yield "pipeloom classic, warm_start", lambda: classic(True)
    yield "pipeloom.compat", lambda: pipeloom.compat.DataLoader(dataset, **torch_args)


def one_run(make: Any) -> tuple[float, float, float, list[list[int]]]:
    """(first batch s, first epoch s, second epoch's first batch s, batches' indices)."""
    indices: list[list[int]] = []
    clock = Clock.now()
    loader = make()
    try:
        first = run_epoch(loader, since=clock, visit=lambda b: indices.append(b[0].tolist()))
        second = run_epoch(loader, size=lambda b: len(b[0]))
    finally:
        shutdown(loader)
    if second.items != READ:
        raise AssertionError(f"the second epoch read {second.items} of {READ} items")
    return first.first, first.wall, second.first, indices


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="32 MiB, 2 workers, 1 run")
    parser.add_argument("--sizes", type=int, nargs="+", help="dataset sizes, MiB")
    parser.add_argument("--workers", type=int, nargs="+", help="worker counts")
    parser.add_argument("--repeats", type=int, help="fresh loaders per configuration")
    args = parser.parse_args(argv)
    quiet_torch_warnings()
    if args.quick:
        sizes, worker_counts, repeats = (32,), (2,), 1
    else:
        sizes, worker_counts, repeats = (16, 32, 64, 128), (2, 4), 3
    sizes = tuple(args.sizes or sizes)
    worker_counts = tuple(args.workers or worker_counts)
    repeats = args.repeats or repeats
    first_pipeloom: list[float] = []  # the process's first pipeloom loader starts the server
    expected = [list(range(s, s + BATCH)) for s in range(0, READ, BATCH)]
    rows = []
    for mib in sizes:
        dataset = Strings(mib)
        start = time.perf_counter()
        pickled = len(pickle.dumps(dataset, protocol=pickle.HIGHEST_PROTOCOL))
        pickling = time.perf_counter() - start
        for workers in worker_counts:
            makers = dict(loaders(dataset, workers))
            runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in makers}
            for _ in range(repeats):  # round-robin, so drift in machine load hits all alike
                for name, make in makers.items():
                    first, wall, second, indices = one_run(make)
                    if name != "torch" and not first_pipeloom:
                        first_pipeloom.append(first)
                    if indices != expected:
                        raise AssertionError(f"{name} yields other batches than torch's")
                    runs[name].append((first, wall, second))
            medians = {
                name: tuple(statistics.median(r[k] for r in rs) for k in range(3))
                for name, rs in runs.items()
            }
            torch_first, _, torch_second = medians["torch"]
            for name, (first, wall, second) in medians.items():
                rows.append(
                    [
                        f"{mib} ({pickled / MIB:.0f} MiB pickled in {pickling:.2f} s)",
                        workers,
                        name,
                        f"{first * 1e3:.0f}",
                        "" if name == "torch" else f"{torch_first / first:.2f}x",
                        f"{wall * 1e3:.0f}",
                        f"{second * 1e3:.0f}",
                        "" if name == "torch" else f"{torch_second / second:.2f}x",
                    ]
                )
        del dataset
    print_table(
        f'start_method="spawn", persistent workers, batch {BATCH}, {READ} items read per epoch, '
        f"fresh loader per run, median of {repeats}",
        [
            "dataset MiB of strings",
            "workers",
            "loader",
            "first batch ms",
            "vs torch",
            "first epoch ms",
            "2nd epoch first batch ms",
            "vs torch",
        ],
        rows,
    )
    note(
        "first batch: from building the loader (worker start-up and sending the dataset "
        "included); 2nd epoch: from iter() on the same loader, workers already running. "
        "'vs torch': torch's time over the loader's (> 1: sooner than torch)."
    )
    if first_pipeloom and os.environ.get("PIPELOOM_SPAWN_SERVER", "1") != "0":
        note(
            f"the process's first pipeloom loader (it starts pipeloom's start server, once per "
            f"process): first batch in {first_pipeloom[0] * 1e3:.0f} ms; counted in its median."
        )


if __name__ == "__main__":
    main()
