"""What collecting statistics costs on the cheap-items pipeline (#18: on by default if <= 3 %).

    python benchmarks/bench_stats_overhead.py [--quick]

The pipeline of ``bench_cheap_items.py`` (20,000 rows of 16 floats, batches of
256 and of 16, collated by ``torch.stack``), in-process and under
``MultiProcessingReadingService(2)``, each loader built with
``stats=False`` and ``stats=True``. Epochs alternate off/on in one run
(interleaved, so a noisy neighbour hits both alike); the figures are the median
items/s of each, and the median of the on/off ratios of consecutive pairs
(< 1: statistics cost that much), with its spread (quartiles), and the CPU the
sampling thread used as a share of the statistics' elapsed time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_cheap_items import SmallRows, stack

import pipeloom
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import InProcessReadingService, MultiProcessingReadingService


def loader(dataset: SmallRows, batch: int, workers: int, stats: bool) -> pipeloom.DataLoader:
    order = list(range(len(dataset)))
    pipe = IterableWrapper(order).sharding_filter().map(dataset.__getitem__)
    service = (
        InProcessReadingService()
        if workers == 0
        else MultiProcessingReadingService(workers, persistent_workers=True)
    )
    return pipeloom.DataLoader(pipe.batch(batch).collate(stack), service, seed=0, stats=stats)


def epoch_rate(dl: pipeloom.DataLoader, items: int) -> float:
    start = time.perf_counter()
    for _ in dl:
        pass
    return items / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer items and epochs")
    parser.add_argument("--pairs", type=int, default=15, help="off/on epoch pairs per setting")
    args = parser.parse_args()
    n, repeats = (4000, 3) if args.quick else (20000, args.pairs)
    dataset = SmallRows(n)
    torch.set_num_threads(1)
    header = f"{'setting':<28} {'off items/s':>12} {'on items/s':>12} {'on/off':>7}"
    print(f"{header} {'quartiles':>13} {'sampler':>9}")
    for workers in (0, 2):
        for batch in (256, 16):
            loaders = {flag: loader(dataset, batch, workers, flag) for flag in (False, True)}
            for dl in loaders.values():
                epoch_rate(dl, n)  # warm-up: workers started, caches filled
            rates: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(repeats):
                for flag in (False, True):
                    rates[flag].append(epoch_rate(loaders[flag], n))
            sampled = loaders[True].stats()
            for dl in loaders.values():
                dl.shutdown()
            off, on = statistics.median(rates[False]), statistics.median(rates[True])
            ratios = [b / a for a, b in zip(rates[False], rates[True], strict=True)]
            low, mid, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
            label = f"{workers} workers, batch {batch}" if workers else f"in-process, batch {batch}"
            share = sampled.sampler_cpu_s / max(sampled.elapsed_s, 1e-9)
            print(
                f"{label:<28} {off:>12.0f} {on:>12.0f} {statistics.median(ratios):>7.3f} "
                f"{low:>6.3f}-{high:.3f} {share:>9.2%}"
            )


if __name__ == "__main__":
    main()
