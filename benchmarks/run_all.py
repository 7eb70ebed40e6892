"""Run every benchmark in one go, each side by side with torch.utils.data.

    python benchmarks/run_all.py [--quick]

Each benchmark prints a markdown table with pipeloom's figure, torch's figure
and their ratio. Results depend on the machine; run on an idle one.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
BENCHMARKS = [
    "bench_overhead",
    "bench_workers",
    "bench_queues",
    "bench_tar",
    "bench_checkpoint",
    "bench_memory",
    "bench_strategies",
    "bench_distributed",
    "bench_compat",
    "bench_packing",
    "bench_cache",
    "bench_startup",
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--only", nargs="*", choices=BENCHMARKS, help="run only these")
    args = parser.parse_args(argv)
    failed = []
    for name in args.only or BENCHMARKS:
        print(f"\n# {name}\n", flush=True)
        start = time.perf_counter()
        command = [sys.executable, str(HERE / f"{name}.py")] + (["--quick"] if args.quick else [])
        if subprocess.run(command, cwd=HERE).returncode != 0:
            failed.append(name)
        print(f"\n({name} took {time.perf_counter() - start:.0f} s)", flush=True)
    if failed:
        sys.exit(f"benchmarks that failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
