"""Scaling over ranks: pipeloom vs torch DataLoader + DistributedSampler, one run.

    python benchmarks/bench_distributed.py [--quick]

An I/O-bound map-style data set: item ``i`` waits ``item_ms`` (a sleep, like a
read from disk or network) and returns a small tensor. ``1`` and ``2`` ranks
(gloo on 127.0.0.1, spawned processes), each with one worker process, read one
epoch of ``n`` items in batches of ``batch``:

- torch: ``DataLoader(dataset, batch, sampler=DistributedSampler(dataset,
  shuffle=False), num_workers=1)``;
- pipeloom: ``SequenceWrapper(dataset).to_iter().batch(batch).collate()`` under
  ``SequentialReadingService(DistributedReadingService(), MultiProcessingReadingService(1))``
  (the ranks agree on the end from ``len()``: no per-step collective);
- pipeloom, step: the same with ``end_check="step"`` (one all-reduce per batch).

Each run builds a fresh loader in every rank (worker start-up counts) after a
barrier; total throughput is all ranks' items over the slowest rank's wall
time, the median of the repeats. Scaling: throughput over the one-rank figure
of the same loader (2.00 is linear). The last column: pipeloom over torch.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import socket
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.utils.data
from _common import print_table

import pipeloom
from pipeloom.datapipes import SequenceWrapper
from pipeloom.reading_service import (
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)

LOADERS = ("torch", "pipeloom", "pipeloom, step")


class SleepyDataset(torch.utils.data.Dataset):
    """Item ``i``: wait ``item_ms`` (simulated I/O), return ``[i, i, i, i]``."""

    def __init__(self, n: int, item_ms: float) -> None:
        self.n = n
        self.item_ms = item_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.item_ms / 1000)
        return torch.full((4,), index)


def make_loader(name: str, dataset: SleepyDataset, batch: int):
    if name == "torch":
        sampler = torch.utils.data.DistributedSampler(dataset, shuffle=False)
        return torch.utils.data.DataLoader(
            dataset, batch, sampler=sampler, num_workers=1, multiprocessing_context="fork"
        )
    end_check = "step" if name.endswith("step") else "auto"
    service = SequentialReadingService(
        DistributedReadingService(end_check=end_check, timeout=60),
        MultiProcessingReadingService(1, start_method="fork"),
    )
    return pipeloom.DataLoader(SequenceWrapper(dataset).to_iter().batch(batch).collate(), service)


def rank_main(rank: int, world: int, port: int, config: dict[str, Any], out: Any) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    torch.set_num_threads(1)
    dataset = SleepyDataset(config["n"], config["item_ms"])
    for repeat in range(config["repeats"]):
        for name in LOADERS:
            dist.barrier()
            start = time.perf_counter()
            loader = make_loader(name, dataset, config["batch"])
            items = sum(len(batch) for batch in loader)
            wall = time.perf_counter() - start
            if isinstance(loader, pipeloom.DataLoader):
                loader.shutdown()
            out.put((name, repeat, rank, items, wall))
    dist.barrier()
    dist.destroy_process_group()


def run_world(world: int, config: dict[str, Any]) -> dict[str, float]:
    """``{loader: median total items/s}`` with ``world`` ranks."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ranks = [
        context.Process(target=rank_main, args=(rank, world, port, config, out))
        for rank in range(world)
    ]
    for process in ranks:
        process.start()
    records = [out.get(timeout=300) for _ in range(world * config["repeats"] * len(LOADERS))]
    for process in ranks:
        process.join(60)
        if process.exitcode != 0:
            raise RuntimeError(f"a rank exited with code {process.exitcode}")
    throughput: dict[str, float] = {}
    for name in LOADERS:
        runs = []
        for repeat in range(config["repeats"]):
            mine = [r for r in records if r[0] == name and r[1] == repeat]
            runs.append(sum(r[3] for r in mine) / max(r[4] for r in mine))
        throughput[name] = statistics.median(runs)
    return throughput


def main(argv: list[str] | None = None) -> list[list[Any]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer items and repeats")
    args = parser.parse_args(argv)
    config = {"n": 240, "item_ms": 5.0, "batch": 8, "repeats": 2}
    if not args.quick:
        config.update(n=800, repeats=3)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = {world: run_world(world, config) for world in (1, 2)}
    rows = []
    for world in (1, 2):
        for name in LOADERS:
            value = results[world][name]
            rows.append(
                [
                    f"{world} x 1 worker",
                    name,
                    f"{value:.0f}",
                    f"{value / results[1][name]:.2f}",
                    "" if name == "torch" else f"{value / results[world]['torch']:.2f}x",
                ]
            )
    print_table(
        f"ranks x workers, I/O-bound items ({config['item_ms']:g} ms sleep each), "
        f"{config['n']} items, batch {config['batch']}, fresh loader, median of "
        f"{config['repeats']}",
        ["ranks", "loader", "items/s (all ranks)", "scaling vs 1 rank", "vs torch"],
        rows,
    )
    return rows


if __name__ == "__main__":
    main()
