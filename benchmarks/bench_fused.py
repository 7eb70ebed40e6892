"""Per-item cost in one process: cheap items against their ceiling, epoch by epoch.

    python benchmarks/bench_fused.py [--quick] [--items N] [--rounds R]

Issue #16 goals 1 and 7, measured so that load on a shared machine hurts as
little as possible: one process builds every loader of
``bench_cheap_items.py``'s in-process rows once (native, native + 3 maps,
torch's loader over the same dataset and over the one calling the 3 functions,
``ThreadReadingService(2)`` and ``(4)`` over the native pipeline), then runs
them in rounds, one epoch each, alternating with the ceiling (the same
``__getitem__`` calls + collate in a bare loop). Each ratio is the median over
the rounds of the ratio *within* a round, so a load spike hits both sides.
Every loader's batches are checked equal to the ceiling's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import bench_cheap_items as cheap
import torch
from _common import print_table, quiet_torch_warnings, shutdown

from pipeloom.reading_service import InProcessReadingService, ThreadReadingService


def ceilings(dataset: cheap.SmallRows) -> dict[str, Callable[[], list[torch.Tensor]]]:
    order = list(range(len(dataset)))
    getitem, f, stack, n = dataset.__getitem__, cheap.unchanged, cheap.stack, len(order)

    def plain() -> list[torch.Tensor]:
        return [stack([getitem(i) for i in order[s : s + 256]]) for s in range(0, n, 256)]

    def chained() -> list[torch.Tensor]:
        return [stack([f(f(f(getitem(i)))) for i in order[s : s + 256]]) for s in range(0, n, 256)]

    return {"ceiling": plain, "ceiling + 3": chained}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="4,000 items, 3 rounds")
    parser.add_argument("--items", type=int, help="items per epoch (20000)")
    parser.add_argument("--rounds", type=int, help="epochs per loader (9)")
    args = parser.parse_args(argv)
    n = args.items or (4_000 if args.quick else 20_000)
    rounds = args.rounds or (3 if args.quick else 9)
    quiet_torch_warnings()
    dataset, chained = cheap.SmallRows(n), cheap.SmallRowsChained(n)
    loaders: dict[str, Any] = {
        "native": cheap.native(dataset, 256, InProcessReadingService()),
        "native + 3 maps": cheap.native(
            dataset, 256, InProcessReadingService(), extra_maps=cheap.EXTRA_MAPS
        ),
        "torch": cheap.torch_loader(dataset, 256, 0),
        "torch + 3": cheap.torch_loader(chained, 256, 0),
        "threads x2": cheap.native(dataset, 256, ThreadReadingService(2)),
        "threads x4": cheap.native(dataset, 256, ThreadReadingService(4)),
    }
    runs = {**ceilings(dataset), **{name: (lambda lo=lo: list(lo)) for name, lo in loaders.items()}}
    expected = runs["ceiling"]()
    for name, run in runs.items():
        got = run()  # warm up, and check
        if not all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)):
            raise AssertionError(f"{name} yields different batches than the ceiling's loop")
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    for loader in loaders.values():
        shutdown(loader)

    def ratio(name: str, base: str) -> str:
        value = statistics.median(b / a for a, b in zip(times[name], times[base]))
        return f"{value:.2f}"

    def rate(name: str) -> str:
        return f"{n / statistics.median(times[name]):,.0f}"

    def row(name: str, ceiling: str, torch_name: str) -> list[str]:
        versus = "1.00" if name == torch_name else ratio(name, torch_name)
        return [name, rate(name), ratio(name, ceiling), versus]

    rows = [
        row("native", "ceiling", "torch"),
        row("native + 3 maps", "ceiling + 3", "torch + 3"),
        row("torch", "ceiling", "torch"),
        row("torch + 3", "ceiling + 3", "torch + 3"),
        row("threads x2", "ceiling", "torch"),
        row("threads x4", "ceiling", "torch"),
        [f"ceiling ({rate('ceiling')} items/s; + 3: {rate('ceiling + 3')})", "", "1.00", ""],
    ]
    print_table(
        f"cheap items in one process, {n} items, batch 256, median of {rounds} interleaved rounds",
        ["loader", "items/s", "of ceiling", "vs torch in-process"],
        rows,
    )


if __name__ == "__main__":
    main()
