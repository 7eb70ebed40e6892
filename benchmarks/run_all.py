"""Run every benchmark in one go, each side by side with torch.utils.data.

    python benchmarks/run_all.py [--quick] [--only NAME ...] [--markdown PATH]

Each benchmark prints markdown tables with pipeloom's figures, torch's figures
and their ratios. Results depend on the machine; run on an idle one. With
``--markdown PATH`` every table and note is also written to PATH (one section
per benchmark, after a header naming the machine, the versions, the commit and
the load average), ready to paste into docs/performance.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import pathlib
import platform
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
BENCHMARKS = [
    "bench_overhead",
    "bench_cheap_items",
    "bench_fused",
    "bench_gil_baton",
    "bench_threads",
    "bench_workers",
    "bench_queues",
    "bench_tar",
    "bench_images",
    "bench_checkpoint",
    "bench_memory",
    "bench_big_batches",
    "bench_strategies",
    "bench_spawn_start",
    "bench_distributed",
    "bench_compat",
    "bench_packing",
    "bench_cache",
    "bench_startup",
    "bench_stats_overhead",
    "bench_autotune",
    "bench_ray",
]
OPTIONS = {"bench_memory": ["--workload", "all"]}  # more than a benchmark's default
MARKDOWN_ENV = "PIPELOOM_BENCH_MARKDOWN"  # read by _common.print_table and _common.note


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _commit() -> str:
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=HERE,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return done.stdout.strip()


def _load() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def markdown_header(args: argparse.Namespace) -> str:
    command = "python benchmarks/run_all.py" + (" --quick" if args.quick else "")
    if args.only:
        command += " --only " + " ".join(args.only)
    return (
        "# pipeloom benchmarks\n\n"
        f"- command: `{command}`\n"
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}\n"
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, torch {_version('torch')}, numpy {_version('numpy')}, "
        f"Pillow {_version('pillow')}\n"
        f"- commit: {_commit()}\n"
        f"- load average (1 / 5 / 15 min) at start: {_load()}\n"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--only", nargs="*", choices=BENCHMARKS, help="run only these")
    parser.add_argument("--markdown", metavar="PATH", help="also write every table to PATH")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    markdown = pathlib.Path(args.markdown).resolve() if args.markdown else None
    if markdown is not None:
        markdown.write_text(markdown_header(args), encoding="utf-8")
        env[MARKDOWN_ENV] = str(markdown)
    else:
        env.pop(MARKDOWN_ENV, None)
    failed = []
    for name in args.only or BENCHMARKS:
        print(f"\n# {name}\n", flush=True)
        options = OPTIONS.get(name, []) + (["--quick"] if args.quick else [])
        if markdown is not None:
            shown = " ".join(["python", f"benchmarks/{name}.py", *options])
            with markdown.open("a", encoding="utf-8") as out:
                out.write(f"\n## {name}\n\n`{shown}`\n")
        start = time.perf_counter()
        command = [sys.executable, str(HERE / f"{name}.py"), *options]
        code = subprocess.run(command, cwd=HERE, env=env).returncode
        took = time.perf_counter() - start
        if code != 0:
            failed.append(name)
        print(f"\n({name} took {took:.0f} s)", flush=True)
        if markdown is not None:
            with markdown.open("a", encoding="utf-8") as out:
                status = "" if code == 0 else f"; **failed with exit code {code}**"
                out.write(f"\n({name} took {took:.0f} s{status})\n")
    if markdown is not None:
        with markdown.open("a", encoding="utf-8") as out:
            out.write(f"\nload average (1 / 5 / 15 min) at the end: {_load()}\n")
        print(f"\nmarkdown written to {markdown}")
    if failed:
        sys.exit(f"benchmarks that failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
