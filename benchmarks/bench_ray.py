"""Ray actors: per-batch overhead at 1 MiB batches, and scaling from 1 to 2 actors, in one run.

    python benchmarks/bench_ray.py [--quick] [--repeats N]

Issue #20's figures, side by side with ``MultiProcessingReadingService``
(classic) and torch's ``DataLoader``; every loader's second epoch is timed
(the first starts the workers), the best of the repeats.

1. **Per-batch overhead**: each source position becomes one 1 MiB float32
   NumPy array (a "batch"; making it costs ~0.1 ms), read with one worker
   (actor). The overhead is the loader's time per batch minus the in-process
   time per batch. Goal: Ray < 2 ms per batch.
2. **Scaling**: a stage that sleeps 10 ms per item (I/O-bound work), with 1
   and 2 workers (actors); the speed-up from 1 to 2. Goal: >= 1.8x.

Starts a local Ray cluster (``num_cpus=2``, no dashboard) and stops it at the end.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray
import torch.utils.data
from _common import best_time, consume, note, print_table, quiet_torch_warnings, shutdown

import pipeloom
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import MultiProcessingReadingService, RayReadingService

MIB_FLOATS = 2**18  # float32s in 1 MiB
SLEEP = 0.01


def one_mib(i: int) -> np.ndarray:
    return np.full(MIB_FLOATS, i, dtype=np.float32)


def sleepy(i: int) -> int:
    time.sleep(SLEEP)
    return i


class Items(torch.utils.data.Dataset):
    def __init__(self, n: int, fn: Callable[[int], Any]) -> None:
        self.n = n
        self.fn = fn

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Any:
        return self.fn(index)


def loaders(n: int, workers: int, fn: Callable[[int], Any]) -> dict[str, Callable[[], Any]]:
    def ours(service: Any) -> Callable[[], Any]:
        def make() -> Any:
            pipe = IterableWrapper(range(n)).sharding_filter().map(fn)
            return pipeloom.DataLoader(pipe, service(), seed=0)

        return make

    def torch_loader() -> Any:
        return torch.utils.data.DataLoader(
            Items(n, fn), batch_size=None, num_workers=workers, persistent_workers=True
        )

    return {
        "torch DataLoader": torch_loader,
        "pipeloom processes": ours(
            lambda: MultiProcessingReadingService(workers, persistent_workers=True)
        ),
        "pipeloom ray": ours(lambda: RayReadingService(workers)),
    }


def timed_second_epoch(make: Callable[[], Any], repeats: int) -> float:
    loader = make()
    try:
        consume(loader)  # start the workers
        return best_time(lambda: consume(loader), repeats)
    finally:
        shutdown(loader)


def overhead_rows(n: int, repeats: int) -> list[list[Any]]:
    pipe = IterableWrapper(range(n)).sharding_filter().map(one_mib)
    baseline = best_time(lambda: consume(pipeloom.DataLoader(pipe, seed=0)), repeats) / n
    rows = [["in-process (making the batch)", f"{baseline * 1e3:.2f}", ""]]
    for name, make in loaders(n, 1, one_mib).items():
        per_batch = timed_second_epoch(make, repeats) / n
        rows.append([name, f"{per_batch * 1e3:.2f}", f"{(per_batch - baseline) * 1e3:.2f}"])
    return rows


def scaling_rows(n: int, repeats: int) -> list[list[Any]]:
    one = {name: timed_second_epoch(make, repeats) for name, make in loaders(n, 1, sleepy).items()}
    two = {name: timed_second_epoch(make, repeats) for name, make in loaders(n, 2, sleepy).items()}
    return [
        [name, f"{n / one[name]:.0f}", f"{n / two[name]:.0f}", f"{one[name] / two[name]:.2f}x"]
        for name in one
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    batches = 100 if args.quick else 500
    sleeps = 60 if args.quick else 200
    quiet_torch_warnings()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        print_table(
            f"Per-batch time at 1 MiB batches, 1 worker/actor ({batches} batches, "
            f"best of {repeats})",
            ["loader", "ms per batch", "overhead, ms per batch"],
            overhead_rows(batches, repeats),
        )
        note(
            "overhead = the loader's time per batch minus the in-process time per batch "
            "(goal for Ray: < 2 ms)"
        )
        print_table(
            f"Scaling a stage that sleeps {SLEEP * 1e3:.0f} ms per item ({sleeps} items, "
            f"best of {repeats})",
            ["loader", "items/s, 1 worker", "items/s, 2 workers", "speed-up"],
            scaling_rows(sleeps, repeats),
        )
        note("speed-up from 1 to 2 workers/actors (goal for Ray: >= 1.8x)")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
