"""Classic, economic and chunked multiprocessing vs torch.utils.data.DataLoader, one run.

    python benchmarks/bench_strategies.py [--quick]

Same simulated work as ``bench_workers.py`` (item ``i`` waits ``file_time``,
then burns ``process_time`` of CPU; a consumer trains ``train_time`` per
batch), at equal ``num_workers`` for every loader:

- torch: ``torch.utils.data.DataLoader(dataset, batch_size, num_workers)``;
- pipeloom ``strategy="classic"``, ``"economic"`` and ``"chunked"`` over
  ``SequenceWrapper(range(n)).to_iter().map(work).batch(b).collate()``.

Two tables: throughput on the workloads of ``bench_workers.py`` (economic and
chunked must not be slower than classic/torch), and a "Big"
environment (0.6 s load + 0.2 s process per item, batch 4, chunk 1; scaled
by ``--scale``: 1 by default, 1/10 with ``--quick``) where the time to
the first batch and the fraction of time the consumer is blocked show what
spreading one batch over many workers buys. Outputs are checked identical.
Large items (8 MiB, batch 16) are in ``bench_big_batches.py``.
"""

from __future__ import annotations

import argparse
import statistics
import warnings
from typing import Any

from _common import print_table
from bench_workers import CASES, Case, Run, Work, WorkDataset, pipeloom_loader, torch_loader, train

from pipeloom.reading_service import MultiProcessingReadingService

STRATEGIES = ("classic", "economic", "chunked")


def makers(dataset: WorkDataset, batch: int, workers: int, chunk: int | None):
    yield "torch", lambda: torch_loader(dataset, batch, workers)
    for strategy in STRATEGIES:
        extra: dict[str, Any] = {"chunk_size": chunk} if strategy == "chunked" and chunk else {}
        yield (
            f"pipeloom {strategy}",
            lambda strategy=strategy, extra=extra: pipeloom_loader(
                dataset, batch, MultiProcessingReadingService(workers, strategy=strategy, **extra)
            ),
        )


def measure(
    case: Case, workers: int, n: int, batch: int, repeats: int, train_time: float, chunk=None
) -> dict[str, tuple[float, float, float]]:
    dataset = WorkDataset(n, Work(case.file_time, case.process_time))
    loaders = dict(makers(dataset, batch, workers, chunk))
    runs: dict[str, list[Run]] = {name: [] for name in loaders}
    reference = None
    for _ in range(repeats):  # round-robin, so drift in machine load hits every loader alike
        for name, make in loaders.items():
            run = train(make, train_time)
            sums = [float(b.sum()) for b in run.batches]
            if reference is None:
                reference = sums
            elif sums != reference:
                raise AssertionError(f"{name} yields different batches than torch in {case.name}")
            run.batches = []
            runs[name].append(run)
    return {
        name: (
            statistics.median(r.wall for r in rs),
            statistics.median(r.waited / r.wall for r in rs),
            statistics.median(r.first for r in rs),
        )
        for name, rs in runs.items()
    }


def rows_for(label: str, workers: int, results: dict[str, tuple[float, float, float]]) -> list:
    torch_wall = results["torch"][0]
    classic_wall = results["pipeloom classic"][0]
    rows = []
    for name, (wall, waited, first) in results.items():
        rows.append(
            [
                label,
                workers,
                name,
                f"{wall:.3f}",
                f"{waited:.0%}",
                f"{first * 1e3:.0f}",
                "" if name == "torch" else f"{torch_wall / wall:.2f}x",
                f"{classic_wall / wall:.2f}x" if name.startswith("pipeloom") else "",
            ]
        )
    return rows


HEADER = [
    "case",
    "workers",
    "loader",
    "wall s",
    "consumer blocked",
    "first batch ms",
    "vs torch",
    "vs classic",
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer items and repeats")
    parser.add_argument(
        "--scale", type=float, default=None, help="time scale of the Big case (1; --quick: 0.1)"
    )
    args = parser.parse_args(argv)
    if args.scale is None:
        args.scale = 0.1 if args.quick else 1.0
    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
    n, batch, repeats = (128, 16, 1) if args.quick else (384, 16, 3)
    rows = []
    for case in CASES:
        for workers in (2, 4):
            train_time = 0.5 * batch * (case.file_time + case.process_time) / workers
            label = f"{case.name} ({case.file_time * 1e3:g}/{case.process_time * 1e3:g} ms)"
            rows += rows_for(label, workers, measure(case, workers, n, batch, repeats, train_time))
    print_table(
        f"throughput: {n} items, batch {batch}, fresh loader per run, median of {repeats}",
        HEADER,
        rows,
    )
    big = Case("Big", file_time=0.6 * args.scale, process_time=0.2 * args.scale)
    big_batch, workers = 4, 8
    big_n = 32 if args.quick else 64
    rows = []
    for ratio in (1, 3):  # a slow and a fast dataflow: load time / train time
        train_time = big_batch * (big.file_time + big.process_time) / workers / ratio
        results = measure(big, workers, big_n, big_batch, repeats, train_time, chunk=1)
        rows += rows_for(f"Big x{args.scale:g}, dataflow ratio {ratio}", workers, results)
    print_table(
        f"Big environment: {big_n} items of {big.file_time * 1e3:g} ms load + "
        f"{big.process_time * 1e3:g} ms CPU, batch {big_batch}, chunk 1, {workers} workers",
        HEADER,
        rows,
    )


if __name__ == "__main__":
    main()
