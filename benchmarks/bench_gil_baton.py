"""Worker threads against each other on cheap items: the GIL baton off, auto and on.

    python benchmarks/bench_gil_baton.py [--quick] [--items N] [--epochs E]

``bench_cheap_items.py``'s native pipeline (``torch.tensor(row)`` of 16
floats per item, batch 256 collated by ``torch.stack``) under
``InProcessReadingService()`` and ``ThreadReadingService(w, gil_baton=mode)``
for w in 2, 4 and each mode, every loader built once (persistent), run in
rounds of one epoch each so that a load spike hits every loader alike.

Per loader: the median over the rounds of its items/s over in-process's in
the same round (wall) and of in-process's CPU time per item over its own
(CPU: the robust figure on a loaded machine, where wall ratios swing +-50 %;
also over all epochs together, which counts the bad epochs' cost);
and each worker thread's voluntary context switches per epoch (one per sleep
on the GIL, a lock, a condition or the baton; read from
``/proc/self/task/<tid>/status`` as the thread ends): the median, the worst,
and the epochs in which a worker slept more than 500 times (the threads
handing the GIL to each other every few items). Linux only.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

import bench_cheap_items as cheap
from _common import print_table, quiet_torch_warnings, shutdown

from pipeloom.reading_service import InProcessReadingService, ThreadReadingService
from pipeloom.reading_service.workers import thread as worker_thread

MODES = ("off", "auto", "on")
HAND_OVER_EPOCH = 500  # sleeps per worker per epoch above which the threads ping-pong the GIL


class SleepCounter:
    """Wraps the worker threads' entry point to record each one's sleeps as it ends."""

    def __init__(self) -> None:
        self.sleeps: list[int] = []
        self._run = worker_thread._run  # noqa: SLF001 - a benchmark's probe

    def install(self) -> None:
        def run(*args: Any) -> None:
            try:
                self._run(*args)
            finally:
                self.sleeps.append(_voluntary_switches())

        worker_thread._run = run  # noqa: SLF001

    def uninstall(self) -> None:
        worker_thread._run = self._run  # noqa: SLF001


def _voluntary_switches() -> int:
    with open(f"/proc/self/task/{threading.get_native_id()}/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    return 0


def main(argv: list[str] | None = None) -> list[list[Any]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="5 epochs per loader")
    parser.add_argument("--items", type=int, default=20_000, help="items per epoch (20000)")
    parser.add_argument("--epochs", type=int, help="measured epochs per loader (15)")
    args = parser.parse_args(argv)
    epochs = args.epochs or (5 if args.quick else 15)
    quiet_torch_warnings()
    dataset = cheap.SmallRows(args.items)
    loaders: dict[str, Any] = {"in-process": cheap.native(dataset, 256, InProcessReadingService())}
    for workers in (2, 4):
        for mode in MODES:
            service = ThreadReadingService(workers, gil_baton=mode)
            loaders[f"threads x{workers}, gil_baton={mode!r}"] = cheap.native(dataset, 256, service)
    counter = SleepCounter()
    counter.install()
    results: dict[str, list[tuple[float, float, list[int], float]]] = {name: [] for name in loaders}
    try:
        for round_ in range(epochs + 1):  # the first round warms up
            for name, loader in loaders.items():
                counter.sleeps.clear()
                wall, cpu, items = time.perf_counter(), time.process_time(), 0
                for batch in loader:
                    items += len(batch)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                if round_:
                    results[name].append((items / wall, items / cpu, list(counter.sleeps), cpu))
    finally:
        counter.uninstall()
        for loader in loaders.values():
            shutdown(loader)
    base = results["in-process"]
    rows = []
    for name, runs in results.items():
        walls = [run[0] / ref[0] for run, ref in zip(runs, base)]
        cpus = [run[1] / ref[1] for run, ref in zip(runs, base)]
        cpu_all = sum(ref[3] for ref in base) / sum(run[3] for run in runs)  # same items
        sleeps = [s for run in runs for s in run[2]]
        bad = sum(1 for run in runs if run[2] and max(run[2]) > HAND_OVER_EPOCH)
        rows.append(
            [
                name,
                f"{statistics.median(run[0] for run in runs) / 1e3:,.0f}k/s",
                f"{statistics.median(walls):.2f} ({min(walls):.2f}-{max(walls):.2f})",
                f"{statistics.median(cpus):.2f} / {cpu_all:.2f}",
                f"{statistics.median(sleeps):.0f} / {max(sleeps)}" if sleeps else "",
                f"{bad}/{len(runs)}" if sleeps else "",
            ]
        )
    print_table(
        f"worker threads on cheap items: {args.items:,} items, batch 256, median of {epochs}"
        " interleaved epochs",
        [
            "loader",
            "items/s",
            "wall vs in-process (range)",
            "CPU/item vs in-process: median / all epochs",
            "worker sleeps/epoch: median / worst",
            f"epochs > {HAND_OVER_EPOCH} sleeps",
        ],
        rows,
    )
    return rows


if __name__ == "__main__":
    main()
