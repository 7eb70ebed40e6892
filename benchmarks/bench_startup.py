"""Start-up of the drop-in: time to the first batch and peak memory, vs torch's loader.

    python benchmarks/bench_startup.py [--quick] [--compare-with PATH]

A map-style dataset of ``n`` indices (item ``i`` is ``i``), ``batch_size=256``,
``shuffle=True`` (with torch's global RNG, or with a seeded ``generator=``),
``num_workers=0``; or in order (``SequentialSampler``) with 2 worker processes
(the workers' start is in the figure) -- the same arguments to
``torch.utils.data.DataLoader`` and ``pipeloom.compat.DataLoader``. Each
measurement runs in a fresh interpreter: build the loader, ``next(iter(loader))``,
report the seconds from building to the first batch and the process's peak RSS
(``ru_maxrss``), also above its level after the imports. Runs of the loaders
alternate; the table gives the median of ``--repeats`` runs and torch's figure
over ours (> 1: pipeloom is faster / smaller). Both loaders' first batches are
checked to be equal.

``--compare-with PATH`` adds a row for the ``pipeloom`` found in ``PATH``
(e.g. another checkout), run in the same alternation: a before/after table
from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

from _common import print_table

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


CASES = ("shuffle=True", "shuffle=True, generator", "sequential, 2 workers")


def child(loader: str, n: int, case: str) -> None:
    """Measure one loader in this (fresh) process and print a JSON line."""
    import resource
    import time

    import torch
    import torch.utils.data
    from _common import Indices

    import pipeloom.compat

    after_imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cls = torch.utils.data.DataLoader if loader == "torch" else pipeloom.compat.DataLoader
    torch.manual_seed(0)
    start = time.perf_counter()
    extra = {"generator": torch.Generator().manual_seed(1)} if "generator" in case else {}
    workers = 2 if "2 workers" in case else 0
    loader_ = cls(
        Indices(n), batch_size=256, shuffle="shuffle" in case, num_workers=workers, **extra
    )
    first = next(iter(loader_))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(
        json.dumps(
            {
                "seconds": seconds,
                "peak_mib": peak / 1024,
                "above_imports_mib": (peak - after_imports) / 1024,
                "first": first[:8].tolist(),
            }
        )
    )


def measure(loader: str, n: int, case: str, pythonpath: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([pythonpath, str(HERE)])}
    done = subprocess.run(
        [sys.executable, str(pathlib.Path(__file__).resolve()), "--child", loader, str(n), case],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compare-with", metavar="PATH", help="another pipeloom checkout")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2])
        return
    sizes = [100_000, 1_000_000] if args.quick else [1_000_000, 10_000_000]
    loaders = [("torch", str(ROOT)), ("pipeloom.compat", str(ROOT))]
    if args.compare_with:
        loaders.append((f"pipeloom.compat ({args.compare_with})", args.compare_with))
    rows = []
    for case in CASES:
        for n in sizes:
            rows.extend(compare(loaders, n, case, args.repeats))
    print_table(
        f"Time to the first batch and peak RSS (median of {args.repeats})",
        [
            "sampling",
            "items",
            "loader",
            "first batch s",
            "torch time / ours",
            "peak RSS MiB",
            "above imports MiB",
            "torch RSS / ours",
        ],
        rows,
    )


def compare(loaders: list[tuple[str, str]], n: int, case: str, repeats: int) -> list[list[str]]:
    """One table row per loader: medians of ``repeats`` alternating runs."""
    runs: dict[str, list[dict]] = {name: [] for name, _ in loaders}
    for _ in range(repeats):
        for name, path in loaders:
            kind = "torch" if name == "torch" else "pipeloom"
            runs[name].append(measure(kind, n, case, path))
    firsts = {tuple(run["first"]) for results in runs.values() for run in results}
    if len(firsts) != 1:
        raise SystemExit(f"the loaders' first batches differ at n={n} ({case}): {firsts}")
    torch_seconds = statistics.median(r["seconds"] for r in runs["torch"])
    torch_peak = statistics.median(r["peak_mib"] for r in runs["torch"])
    rows = []
    for name, _ in loaders:
        seconds = statistics.median(r["seconds"] for r in runs[name])
        peak = statistics.median(r["peak_mib"] for r in runs[name])
        above = statistics.median(r["above_imports_mib"] for r in runs[name])
        rows.append(
            [
                case,
                f"{n:,}",
                name,
                f"{seconds:.3f}",
                f"{torch_seconds / seconds:.2f}",
                f"{peak:.0f}",
                f"{above:.0f}",
                f"{torch_peak / peak:.2f}",
            ]
        )
    return rows


if __name__ == "__main__":
    main()
