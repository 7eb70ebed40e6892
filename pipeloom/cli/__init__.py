"""The command line: ``python -m pipeloom demo`` and ``python -m pipeloom profile``.

Example:
    >>> parser().parse_args(["profile", "data:build", "--workers", "2"]).workers
    2
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m pipeloom``."""
    from ._profile import STRATEGIES

    top = argparse.ArgumentParser(prog="python -m pipeloom", description="pipeloom's command line")
    commands = top.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="read small tar shards every way, next to torch's DataLoader (no network)",
    )
    demo.add_argument("--quick", action="store_true", help="a smaller data set (seconds)")
    profile = commands.add_parser(
        "profile",
        help="run a pipeline with statistics: progress, where the time goes, a report",
    )
    profile.add_argument(
        "target", help="module:function returning a pipeline or a DataLoader (not yet iterated)"
    )
    profile.add_argument(
        "--workers", type=_at_least(0), default=None, help="worker threads or processes"
    )
    profile.add_argument("--strategy", choices=STRATEGIES, default=None)
    profile.add_argument(
        "--batches",
        type=_at_least(1),
        default=None,
        help="stop after this many outputs (default: an epoch)",
    )
    profile.add_argument(
        "--auto",
        action="store_true",
        help="autotune threads/processes, workers and prefetch while it runs (output unchanged); "
        "--strategy threads|classic and --workers pick where it starts",
    )
    profile.add_argument(
        "--out", default="pipeloom-profile", help="folder for report.json, timeline.png, placement"
    )
    return top


def _at_least(lowest: int) -> Callable[[str], int]:
    """An argparse type: an int >= ``lowest``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lowest}, got {value}")
        return value

    return parse


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m pipeloom`` with ``argv`` (default ``sys.argv[1:]``); the exit status."""
    args = parser().parse_args(argv)
    if args.command == "demo":
        from ._demo import demo

        return demo(quick=args.quick)
    from ._profile import UsageError, profile

    try:
        return profile(
            args.target,
            workers=args.workers,
            strategy=args.strategy,
            batches=args.batches,
            out=args.out,
            auto=args.auto,
        )
    except UsageError as error:
        print(f"python -m pipeloom profile: {error}", file=sys.stderr)
        return 2
