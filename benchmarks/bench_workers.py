"""Workers under load: pipeloom vs torch.utils.data.DataLoader, one run (I/O then CPU per item).

    python benchmarks/bench_workers.py [--quick]

A map-style dataset of ``n`` items; item ``i`` waits ``file_time`` (simulated
I/O: a sleep, which releases the GIL like a real read) and then burns
``process_time`` of CPU (a busy loop that holds the GIL, the worst case for
threads), giving a small float array. Batches of ``batch`` items are collated
to tensors and a consumer "trains" on each for ``train_time`` (a sleep).

Three loaders over the same work, with the same number of workers:

- torch: ``torch.utils.data.DataLoader(dataset, batch_size, num_workers)``;
- pipeloom threads: ``SequenceWrapper(dataset).to_iter().map(...).batch().collate()``
  under ``ThreadReadingService(workers)``;
- pipeloom processes: the same pipeline under ``MultiProcessingReadingService(workers)``
  (classic placement: each worker builds whole batches from runs of consecutive indices).

Every run starts a fresh loader, so worker start-up is part of the wall time
and of the time to the first batch, as in a first epoch. Per case the table
gives the median over the repeats of: wall time, the fraction of it the
consumer spent blocked waiting for the next batch, the time to the first
batch, and torch's wall time over ours (> 1: pipeloom is faster). The outputs
of the three loaders are checked to be identical.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils.data
from _common import print_table

import pipeloom
from pipeloom.datapipes import SequenceWrapper
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService


@dataclass(frozen=True)
class Case:
    name: str
    file_time: float
    process_time: float


CASES = (
    Case("I/O-bound", file_time=0.005, process_time=0.0002),
    Case("mixed", file_time=0.002, process_time=0.002),
    Case("CPU-bound", file_time=0.0002, process_time=0.003),
)


class Work:
    """Item ``i``: wait ``file_time``, burn ``process_time`` of CPU, return an array."""

    def __init__(self, file_time: float, process_time: float) -> None:
        self.file_time = file_time
        self.process_time = process_time

    def __call__(self, index: int) -> np.ndarray:
        time.sleep(self.file_time)
        deadline = time.perf_counter() + self.process_time
        while time.perf_counter() < deadline:
            pass
        return np.arange(8, dtype=np.float64) + index

    def __repr__(self) -> str:
        return f"Work(file_time={self.file_time}, process_time={self.process_time})"


class WorkDataset(torch.utils.data.Dataset):
    """The torch side: ``dataset[i] == Work(...)(i)``."""

    def __init__(self, n: int, work: Work) -> None:
        self.n = n
        self.work = work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> np.ndarray:
        return self.work(index)


def torch_loader(dataset: WorkDataset, batch: int, workers: int) -> Iterable[Any]:
    return torch.utils.data.DataLoader(dataset, batch_size=batch, num_workers=workers)


def pipeloom_loader(dataset: WorkDataset, batch: int, service) -> pipeloom.DataLoader:
    pipe = SequenceWrapper(range(len(dataset))).to_iter().map(dataset.work).batch(batch).collate()
    return pipeloom.DataLoader(pipe, service, seed=0)


@dataclass
class Run:
    wall: float
    waited: float
    first: float
    batches: list[torch.Tensor]


def train(make_loader: Callable[[], Any], train_time: float) -> Run:
    """Iterate a fresh loader once; sleep ``train_time`` per batch; time the waits."""
    start = time.perf_counter()
    loader = make_loader()
    batches = []
    waited = 0.0
    first = None
    iterator = iter(loader)
    while True:
        asked = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            break
        got = time.perf_counter()
        waited += got - asked
        if first is None:
            first = got - start
        batches.append(batch)
        time.sleep(train_time)
    wall = time.perf_counter() - start
    shutdown = getattr(loader, "shutdown", None)
    if shutdown is not None:
        shutdown()
    del iterator, loader
    return Run(wall, waited, first or wall, batches)


def same_batches(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def median_run(runs: list[Run]) -> tuple[float, float, float]:
    return (
        statistics.median(r.wall for r in runs),
        statistics.median(r.waited / r.wall for r in runs),
        statistics.median(r.first for r in runs),
    )


def loaders(dataset: WorkDataset, batch: int, workers: int):
    yield "torch", lambda: torch_loader(dataset, batch, workers)
    yield (
        f"pipeloom threads x{workers}",
        lambda: pipeloom_loader(dataset, batch, ThreadReadingService(workers)),
    )
    yield (
        f"pipeloom processes x{workers}",
        lambda: pipeloom_loader(dataset, batch, MultiProcessingReadingService(workers)),
    )


def bench_case(case: Case, workers: int, n: int, batch: int, repeats: int) -> list[list[Any]]:
    work = Work(case.file_time, case.process_time)
    dataset = WorkDataset(n, work)
    # The consumer trains for half the time the workers need to load a batch,
    # so a perfect loader keeps it waiting about half the time (a "fast dataflow").
    train_time = 0.5 * batch * (case.file_time + case.process_time) / workers
    makers = dict(loaders(dataset, batch, workers))
    runs: dict[str, list[Run]] = {name: [] for name in makers}
    reference: list[torch.Tensor] | None = None
    for _ in range(repeats):  # round-robin, so drift in machine load hits every loader alike
        for name, make in makers.items():
            run = train(make, train_time)
            if reference is None:
                reference = run.batches
            elif not same_batches(reference, run.batches):
                raise AssertionError(f"{name} yields different batches than torch in {case.name}")
            run.batches = []
            runs[name].append(run)
    results = {name: median_run(r) for name, r in runs.items()}
    names = list(makers)
    torch_wall, torch_wait, torch_first = results["torch"]
    rows = []
    for name in names:
        wall, wait, first = results[name]
        ratio = "" if name == "torch" else f"{torch_wall / wall:.2f}x"
        rows.append(
            [
                f"{case.name} ({case.file_time * 1e3:g}/{case.process_time * 1e3:g} ms)",
                workers,
                f"{train_time * 1e3:.1f}",
                name,
                f"{wall:.3f}",
                f"{wait:.0%}",
                f"{first * 1e3:.0f}",
                ratio,
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> list[list[Any]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer items and repeats (< 1 min)")
    args = parser.parse_args(argv)
    # torch warns when num_workers exceeds the CPU count; the comparison is deliberate.
    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
    n, batch, repeats = (192, 16, 2) if args.quick else (384, 16, 5)
    rows = []
    for case in CASES:
        for workers in (2, 4):
            rows.extend(bench_case(case, workers, n, batch, repeats))
    print_table(
        f"workers under load: {n} items, batch {batch}, fresh loader per run, median of {repeats}"
        f" (file/process ms per item; train ms per batch)",
        [
            "case",
            "workers",
            "train ms",
            "loader",
            "wall s",
            "consumer waits",
            "first batch ms",
            "speed-up vs torch",
        ],
        rows,
    )
    return rows


if __name__ == "__main__":
    main()
