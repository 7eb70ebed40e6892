"""Framework overhead per item: pipeloom vs torch.utils.data.DataLoader, one run.

    python benchmarks/bench_overhead.py [--quick]

Trivial items (item i is the int i), batch 1 and batch 256, collated to
tensors, in the calling process and with 2 workers. Lower µs/item is better;
the ratio is torch's time over ours (> 1 means pipeloom is faster).
"""

from __future__ import annotations

import argparse

import torch.utils.data
from _common import Indices, best_time, consume, print_table

import pipeloom
from pipeloom.datapipes import SequenceWrapper
from pipeloom.reading_service import ThreadReadingService


def torch_loader(n: int, batch: int, workers: int):
    return torch.utils.data.DataLoader(
        Indices(n), batch_size=batch, num_workers=workers, persistent_workers=workers > 0
    )


def pipeloom_loader(n: int, batch: int, service):
    pipe = SequenceWrapper(range(n)).to_iter().batch(batch).collate()
    return pipeloom.DataLoader(pipe, service, seed=0)


def services(workers: int):
    yield "in-process", None
    if workers:
        yield f"threads x{workers}", ThreadReadingService(workers)
        try:
            from pipeloom.reading_service import MultiProcessingReadingService
        except ImportError:
            return
        service = MultiProcessingReadingService(workers, persistent_workers=True)
        yield f"processes x{workers}", service


def main(argv: list[str] | None = None) -> list[list]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    base_n = 20_000 if args.quick else 200_000
    repeats = 2 if args.quick else 3
    rows = []
    for batch in (1, 256):
        for workers in (0, 2):
            # one item per inter-process message is slow everywhere: use fewer items
            n = base_n // 20 if batch == 1 and workers else base_n
            loader = torch_loader(n, batch, workers)
            consume(loader)  # warm up (starts persistent workers)
            torch_us = best_time(lambda loader=loader: consume(loader), repeats) / n * 1e6
            del loader
            for name, service in services(workers):
                if (workers == 0) != (service is None):
                    continue
                ours = pipeloom_loader(n, batch, service)
                consume(ours)
                our_us = best_time(lambda ours=ours: consume(ours), repeats) / n * 1e6
                ours.shutdown()
                rows.append(
                    [
                        f"batch {batch}",
                        f"torch workers={workers}",
                        name,
                        f"{torch_us:.2f}",
                        f"{our_us:.2f}",
                        f"{torch_us / our_us:.2f}x",
                    ]
                )
    print_table(
        f"framework overhead, {base_n} trivial items (µs per item, lower is better)",
        ["case", "torch", "pipeloom", "torch µs/item", "pipeloom µs/item", "speed-up"],
        rows,
    )
    return rows


if __name__ == "__main__":
    main()
