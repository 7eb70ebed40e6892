"""Cheap items, a small tensor each: pipeloom vs torch.utils.data.DataLoader, one run.

    python benchmarks/bench_cheap_items.py [--quick]

The shape of a typical "cheap items" training job (issue #16, first table):
a map-style dataset whose ``__getitem__`` returns ``torch.tensor(row)`` of a
precomputed row of 16 floats, read in sampler order (``SequentialSampler``),
batches of 256 (and of 1) collated by a function that stacks, 20,000 items.

Rows, at 0 (in-process), 2 and 4 workers:

- native: ``IterableWrapper(order).sharding_filter().map(dataset.__getitem__)
  .batch(b).collate(stack)`` in-process and under
  ``MultiProcessingReadingService(w)`` (classic processes);
- the same with ``strategy="economic"`` and ``strategy="chunked"`` (at 0
  workers every strategy runs in the calling thread: that column shows the noise);
- the same under ``ThreadReadingService(w)``;
- ``pipeloom.compat.DataLoader`` with torch's arguments;
- native with 3 more per-item ``map`` blocks (identity functions: what an extra
  block costs), against a torch dataset that calls the same 3 functions in
  ``__getitem__``.

Each cell is the loader's items/s as a ratio to torch's loader with the same
arguments in the same run (> 1: pipeloom is faster), and the items/s. The
**ceiling** is the same ``__getitem__`` calls in a bare list comprehension plus
the same collate, on one core; every in-process figure is also given as a
fraction of it. Workers are persistent on both sides (pipeloom's threads live as
long as the loader). Two tables per batch size: the steady-state epoch (median
of the repeats, workers already running) and the first epoch, timed from
building the loader, so worker start-up is included. Every loader's batches
are checked equal to torch's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils.data
from _common import (
    Clock,
    Epoch,
    note,
    print_table,
    quiet_torch_warnings,
    rate,
    ratio,
    run_epoch,
    shutdown,
)

import pipeloom
import pipeloom.compat
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)

WIDTH = 16  # floats per row
EXTRA_MAPS = 3
WORKERS = (0, 2, 4)


class SmallRows(torch.utils.data.Dataset):
    """Item ``i`` is ``torch.tensor(rows[i])``, a row of 16 floats precomputed as Python lists."""

    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(0)
        self.rows = rng.standard_normal((n, WIDTH), dtype=np.float32).tolist()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(self.rows[index])


def unchanged(item: torch.Tensor) -> torch.Tensor:
    """A per-item function that does nothing: an extra block's cost is the framework's."""
    return item


class SmallRowsChained(SmallRows):
    """The torch side of the extra-maps row: the same 3 functions, called in ``__getitem__``."""

    def __getitem__(self, index: int) -> torch.Tensor:
        return unchanged(unchanged(unchanged(torch.tensor(self.rows[index]))))


def stack(batch: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(batch)


# --- loaders -------------------------------------------------------------------------------


def torch_loader(dataset: SmallRows, batch: int, workers: int) -> Any:
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch,
        collate_fn=stack,
        num_workers=workers,
        persistent_workers=workers > 0,
    )


def native(dataset: SmallRows, batch: int, service: Any, extra_maps: int = 0) -> Any:
    order = list(torch.utils.data.SequentialSampler(dataset))
    pipe = IterableWrapper(order).sharding_filter().map(dataset.__getitem__)
    for _ in range(extra_maps):
        pipe = pipe.map(unchanged)
    return pipeloom.DataLoader(pipe.batch(batch).collate(stack), service, seed=0)


def processes(strategy: str) -> Callable[[SmallRows, int, int], Any]:
    def make(dataset: SmallRows, batch: int, workers: int) -> Any:
        service = MultiProcessingReadingService(
            workers, strategy=strategy, persistent_workers=workers > 0
        )
        return native(dataset, batch, service)

    return make


def in_process_or_classic(dataset: SmallRows, batch: int, workers: int) -> Any:
    if workers == 0:
        return native(dataset, batch, InProcessReadingService())
    return native(dataset, batch, MultiProcessingReadingService(workers, persistent_workers=True))


def threads(dataset: SmallRows, batch: int, workers: int) -> Any:
    return native(dataset, batch, ThreadReadingService(workers))


def compat(dataset: SmallRows, batch: int, workers: int) -> Any:
    return pipeloom.compat.DataLoader(
        dataset,
        batch_size=batch,
        collate_fn=stack,
        num_workers=workers,
        persistent_workers=workers > 0,
    )


def extra_maps(dataset: SmallRows, batch: int, workers: int) -> Any:
    service = (
        InProcessReadingService()
        if workers == 0
        else MultiProcessingReadingService(workers, persistent_workers=True)
    )
    return native(dataset, batch, service, extra_maps=EXTRA_MAPS)


@dataclass(frozen=True)
class Row:
    label: str
    make: Callable[[SmallRows, int, int], Any]
    chained: bool = False  # compared with the torch dataset that calls the extra functions
    needs_workers: bool = False  # no in-process column


ROWS = (
    Row("native, classic processes", in_process_or_classic),
    Row('native, strategy="economic"', processes("economic")),
    Row('native, strategy="chunked"', processes("chunked")),
    Row("native, ThreadReadingService", threads, needs_workers=True),
    Row("pipeloom.compat.DataLoader, torch's arguments", compat),
    Row(f"native + {EXTRA_MAPS} more per-item maps, classic processes", extra_maps, True),
)


# --- measuring -----------------------------------------------------------------------------


@dataclass
class Cell:
    first: Epoch  # first epoch, from building the loader (start-up included)
    steady: float  # items/s, median over the steady epochs


def measure(make: Callable[[], Any], repeats: int) -> tuple[Cell, list[torch.Tensor]]:
    clock = Clock.now()
    loader = make()
    batches: list[torch.Tensor] = []
    first = run_epoch(loader, since=clock, visit=batches.append)
    steady = [run_epoch(loader).items_per_s for _ in range(repeats)]
    shutdown(loader)
    del loader
    return Cell(first, statistics.median(steady)), batches


def ceiling(dataset: SmallRows, batch: int, repeats: int, chained: bool) -> float:
    """Items/s of the bare loop: the same ``__getitem__`` calls and collate, nothing else.

    ``dataset`` is the plain one; ``chained`` adds the extra functions around each call.
    """
    order = list(torch.utils.data.SequentialSampler(dataset))
    getitem = dataset.__getitem__
    n = len(order)

    def plain() -> list[torch.Tensor]:
        return [stack([getitem(i) for i in order[s : s + batch]]) for s in range(0, n, batch)]

    def with_functions() -> list[torch.Tensor]:
        return [
            stack([unchanged(unchanged(unchanged(getitem(i)))) for i in order[s : s + batch]])
            for s in range(0, n, batch)
        ]

    run = with_functions if chained else plain
    run()  # warm up
    times = []
    for _ in range(max(repeats, 3)):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return n / statistics.median(times)


def same(name: str, ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> None:
    if len(ours) != len(theirs) or not all(torch.equal(a, b) for a, b in zip(ours, theirs)):
        raise AssertionError(f"{name} yields different batches than torch's DataLoader")


def bench_batch(batch: int, sizes: dict[int, int], repeats: int) -> None:
    """Both tables for one batch size; ``sizes[workers]`` is the item count at that column."""
    datasets = {w: SmallRows(n) for w, n in sizes.items()}
    chained = {w: SmallRowsChained(n) for w, n in sizes.items()}
    torch_cells: dict[tuple[bool, int], Cell] = {}
    cells: dict[tuple[str, int], Cell] = {}
    ceilings: dict[bool, float] = {}
    for workers in WORKERS:
        for is_chained, pool in ((False, datasets), (True, chained)):
            dataset = pool[workers]
            cell, reference = measure(
                lambda d=dataset, w=workers: torch_loader(d, batch, w), repeats
            )
            torch_cells[is_chained, workers] = cell
            if workers == 0:  # next to the in-process runs, so machine drift hits both alike
                ceilings[is_chained] = ceiling(datasets[0], batch, repeats, is_chained)
            for row in ROWS:
                if row.chained != is_chained or (row.needs_workers and workers == 0):
                    continue
                base = datasets[workers]  # native pipelines add the functions as blocks
                cell, ours = measure(
                    lambda row=row, d=base, w=workers: row.make(d, batch, w), repeats
                )
                same(f"{row.label} ({workers} workers, batch {batch})", ours, reference)
                cells[row.label, workers] = cell

    for steady in (True, False):

        def speed(cell: Cell, steady: bool = steady) -> float:
            return cell.steady if steady else cell.first.items_per_s

        rows: list[list[Any]] = []
        for is_chained in (False, True):
            top = ceilings[is_chained]
            suffix = f", {EXTRA_MAPS} functions in __getitem__" if is_chained else ""
            reference = [speed(torch_cells[is_chained, w]) for w in WORKERS]
            rows.append(
                [
                    f"torch DataLoader{suffix} (items/s)",
                    rate(reference[0]),
                    f"{reference[0] / top:.2f}",
                    rate(reference[1]),
                    rate(reference[2]),
                ]
            )
            rows.append(
                [f"ceiling{suffix}: bare list comprehension + collate, one core", rate(top)]
                + ["1.00", "", ""]
            )
            for row in ROWS:
                if row.chained != is_chained:
                    continue
                line = [row.label]
                for column, workers in enumerate(WORKERS):
                    cell = cells.get((row.label, workers))
                    if cell is None:
                        line.append("—")
                    else:
                        ours = speed(cell)
                        line.append(f"{ratio(ours, reference[column])} ({rate(ours)})")
                    if column == 0:
                        line.append(f"{speed(cell) / top:.2f}" if cell else "")
                rows.append(line)
        kind = (
            f"steady-state epoch (median of {repeats}, persistent workers already running)"
            if steady
            else "first epoch, from building the loader (worker start-up included)"
        )
        items = ", ".join(f"{n:,} items at {w} workers" for w, n in sizes.items())
        print_table(
            f"cheap items, batch {batch}, {kind}: ratio to torch (items/s); {items}",
            ["pipeline", "in-process", "of ceiling", "2 workers", "4 workers"],
            rows,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer items and epochs (< 1 min)")
    parser.add_argument("--items", type=int, help="items per epoch at batch 256 (20000)")
    args = parser.parse_args(argv)
    quiet_torch_warnings()
    n = args.items or (4_000 if args.quick else 20_000)
    repeats = 1 if args.quick else 5
    bench_batch(256, {w: n for w in WORKERS}, repeats)
    # One message per item between processes is slow everywhere: fewer items with workers.
    small = max(n // 10, 100)
    bench_batch(1, {0: n, 2: small, 4: small}, repeats)
    note(
        "Ratios are items/s over torch's with the same arguments (> 1: pipeloom is faster); "
        "'of ceiling' is the in-process figure over the bare loop's."
    )


if __name__ == "__main__":
    main()
