"""Work multiplied by the worker count: threads and processes vs in-process, one run.

    python benchmarks/bench_threads.py [--quick]

Issue #16, goal 6: ``IterableWrapper(list(range(2_000_000))).sharding_filter()
.map(f).batch(256)`` (``f`` doubles an int; batches are lists) in-process,
under ``ThreadReadingService(n)`` and under ``MultiProcessingReadingService(n)``
at n = 1, 2 and 4. Every run builds a fresh loader and reads one epoch, so
whatever each worker does before its first item (copying the pipeline,
iterating the replicated prefix up to its shard) is in the figures.

Per loader, the median over the repeats of the epoch's wall time and the time
to the first batch, both from building the loader, and the epoch time over
the in-process one (the goal: <= 1). For reference, torch's
``DataLoader(dataset, batch_size=256, num_workers=n, collate_fn=list)`` over a
map-style dataset of the same 2,000,000 ints with ``f`` in ``__getitem__``
runs in the same round; "vs torch" is torch's epoch time at the same n over
the loader's (> 1: faster). Every loader's batches are checked equal.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch.utils.data
from _common import Clock, Epoch, note, print_table, quiet_torch_warnings, run_epoch, shutdown

import pipeloom
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)

BATCH = 256


def f(x: int) -> int:
    return 2 * x


def as_list(batch: list[int]) -> list[int]:
    return batch


class Doubled(torch.utils.data.Dataset):
    """torch's side: item ``i`` is ``f(values[i])``."""

    def __init__(self, values: list[int]) -> None:
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: int) -> int:
        return f(self.values[index])


def pipeline(values: list[int]) -> Any:
    return IterableWrapper(values).sharding_filter().map(f).batch(BATCH)


def loaders(
    values: list[int], counts: tuple[int, ...], prefetch: int = 2
) -> list[tuple[str, int, Callable[[], Any]]]:
    """(name, n, make): in-process first, then per n torch, threads, processes.

    ``prefetch`` is every loader's ``prefetch_factor`` (batches per worker).
    """
    made: list[tuple[str, int, Callable[[], Any]]] = [
        ("in-process", 0, lambda: pipeloom.DataLoader(pipeline(values), InProcessReadingService()))
    ]
    dataset = Doubled(values)
    for n in counts:
        made += [
            (
                "torch DataLoader",
                n,
                lambda n=n: torch.utils.data.DataLoader(
                    dataset,
                    batch_size=BATCH,
                    num_workers=n,
                    collate_fn=as_list,
                    prefetch_factor=prefetch,
                ),
            ),
            (
                "ThreadReadingService",
                n,
                lambda n=n: pipeloom.DataLoader(
                    pipeline(values), ThreadReadingService(n, prefetch_factor=prefetch), seed=0
                ),
            ),
            (
                "MultiProcessingReadingService",
                n,
                lambda n=n: pipeloom.DataLoader(
                    pipeline(values),
                    MultiProcessingReadingService(n, prefetch_factor=prefetch),
                    seed=0,
                ),
            ),
        ]
    return made


def one_run(make: Callable[[], Any]) -> tuple[Epoch, int]:
    checksum = 0

    def visit(batch: list[int]) -> None:
        nonlocal checksum
        checksum = (checksum * 31 + batch[0] + batch[-1]) % (1 << 61)

    clock = Clock.now()
    loader = make()
    try:
        epoch = run_epoch(loader, since=clock, visit=visit)
    finally:
        shutdown(loader)
    return epoch, checksum


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="200,000 items, 1 run")
    parser.add_argument("--items", type=int, help="items per epoch (2,000,000)")
    parser.add_argument(
        "--prefetch-factor",
        type=int,
        default=2,
        help="batches each worker may hold ahead, for every loader (2, torch's default)",
    )
    args = parser.parse_args(argv)
    quiet_torch_warnings()
    items = args.items or (200_000 if args.quick else 2_000_000)
    repeats = 1 if args.quick else 3
    counts = (1, 2, 4)
    values = list(range(items))
    made = loaders(values, counts, args.prefetch_factor)
    runs: dict[tuple[str, int], list[Epoch]] = {(name, n): [] for name, n, _ in made}
    reference = None
    for _ in range(repeats):  # round-robin, so drift in machine load hits every loader alike
        for name, n, make in made:
            epoch, checksum = one_run(make)
            reference = checksum if reference is None else reference
            if checksum != reference or epoch.items != items:
                raise AssertionError(f"{name} x{n} yields other batches than in-process")
            runs[name, n].append(epoch)
    wall = {key: statistics.median(e.wall for e in epochs) for key, epochs in runs.items()}
    first = {key: statistics.median(e.first for e in epochs) for key, epochs in runs.items()}
    in_process = wall["in-process", 0]
    rows = []
    for name, n, _ in made:
        torch_wall = wall.get(("torch DataLoader", n))
        rows.append(
            [
                name,
                n,
                f"{wall[name, n]:.2f}",
                f"{wall[name, n] / in_process:.2f}",
                f"{first[name, n] * 1e3:.0f}",
                ""
                if name == "torch DataLoader" or torch_wall is None
                else f"{torch_wall / wall[name, n]:.2f}x",
            ]
        )
    print_table(
        f"IterableWrapper(list(range({items:,}))).sharding_filter().map(f).batch({BATCH}): "
        f"prefetch_factor={args.prefetch_factor}, fresh loader per run, median of {repeats}",
        ["loader", "n", "epoch s", "epoch / in-process", "first batch ms", "vs torch"],
        rows,
    )
    note(
        "epoch and first batch: from building the loader to the last / first batch. "
        "'epoch / in-process' <= 1 means n workers cost no more than one pass in the calling "
        "thread; 'vs torch': torch's epoch time at the same n over the loader's (> 1: faster)."
    )


if __name__ == "__main__":
    main()
