"""Cheap items under economic and chunked: CPU per batch of every process, and rotated epochs.

    python benchmarks/bench_dispatch_cpu.py [--rounds 9] [--workers 2 4]

The pipeline and torch loader of ``bench_cheap_items.py`` (20,000 rows of 16
floats, batch 256, stack collate, persistent workers). Two measurements that
hold up better than one timed epoch per loader on a shared machine:

- **CPU per batch**: user + system CPU seconds of the main process and of each
  worker (``psutil``) over 5 steady epochs, per batch. Other jobs slow a
  loader's wall clock far more than its CPU time; the CPU time says what a
  loader costs, the wall clock what it got.
- **Rotated epochs**: every loader is built once (workers persistent, idle
  between turns), then each round runs one epoch of each in turn; a loader's
  figure is the median over rounds of its items/s over torch's in the same
  round, so a burst of load hits neighbours, not one loader's whole run.
"""

from __future__ import annotations

import argparse
import gc
import statistics
from typing import Any

import bench_cheap_items as cheap
import psutil
from _common import quiet_torch_warnings, run_epoch, shutdown

BATCH = 256
LOADERS = {
    "torch": cheap.torch_loader,
    "economic": cheap.processes("economic"),
    "chunked": cheap.processes("chunked"),
    "classic": cheap.in_process_or_classic,
}


def cpu_per_batch(loader: Any, items: int, epochs: int = 5) -> tuple[float, list[float]]:
    """Microseconds of CPU per batch: the main process's, and each worker's."""
    me = psutil.Process()
    workers = me.children(recursive=True)

    def times() -> tuple[float, list[float]]:
        return sum(me.cpu_times()[:2]), [sum(w.cpu_times()[:2]) for w in workers]

    main_before, workers_before = times()
    for _ in range(epochs):
        run_epoch(loader)
    main_after, workers_after = times()
    batches = epochs * -(-items // BATCH)
    return (main_after - main_before) / batches * 1e6, [
        (after - before) / batches * 1e6 for before, after in zip(workers_before, workers_after)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args(argv)
    quiet_torch_warnings()
    dataset = cheap.SmallRows(args.items)
    for workers in args.workers:
        print(f"\n{workers} workers, batch {BATCH}, {args.items:,} items")
        for name, make in LOADERS.items():  # one loader at a time: psutil sees its workers
            loader = make(dataset, BATCH, workers)
            run_epoch(loader)
            main_us, worker_us = cpu_per_batch(loader, args.items)
            shutdown(loader)
            del loader  # torch's persistent workers go with their loader
            gc.collect()
            worker_us = [us for us in worker_us if us >= 1]  # not another loader's idle ones
            print(
                f"  {name:9} CPU per batch: {main_us + sum(worker_us):5.0f} us "
                f"(main {main_us:.0f}, workers {' + '.join(f'{w:.0f}' for w in worker_us)})"
            )
        loaders = {name: make(dataset, BATCH, workers) for name, make in LOADERS.items()}
        for loader in loaders.values():
            run_epoch(loader)  # start the workers
        speeds: dict[str, list[float]] = {name: [] for name in loaders}
        for _ in range(args.rounds):
            for name, loader in loaders.items():
                speeds[name].append(run_epoch(loader).items_per_s)
        for loader in loaders.values():
            shutdown(loader)
        line = [f"torch {statistics.median(speeds['torch']) / 1e3:.0f}k/s"]
        for name in list(loaders)[1:]:
            ratios = [ours / theirs for ours, theirs in zip(speeds[name], speeds["torch"])]
            line.append(f"{name} {statistics.median(ratios):.2f}x")
        print(f"  rotated epochs, median of {args.rounds} (ratio to torch): " + ", ".join(line))


if __name__ == "__main__":
    main()
