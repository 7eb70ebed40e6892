"""Shared helpers for the benchmarks: timing, tables, a torch dataset of indices.

Tables and notes go to stdout; when ``run_all.py --markdown PATH`` runs the
benchmarks it sets ``PIPELOOM_BENCH_MARKDOWN=PATH`` and every table and note
is appended to that file as well, ready to paste into docs/performance.md.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch.utils.data

MARKDOWN_ENV = "PIPELOOM_BENCH_MARKDOWN"


class Indices(torch.utils.data.Dataset):
    """Item ``i`` is ``i``: pure framework overhead."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


def best_time(run: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` runs, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def consume(iterable: Iterable[Any]) -> int:
    count = 0
    for _ in iterable:
        count += 1
    return count


# --- epochs: wall time, time to the first batch, this process's CPU -------------------------


@dataclass(frozen=True)
class Clock:
    """A reading of wall time, this process's CPU time and this thread's CPU time."""

    wall: float
    cpu: float
    thread_cpu: float

    @classmethod
    def now(cls) -> Clock:
        return cls(time.perf_counter(), time.process_time(), time.thread_time())


@dataclass
class Epoch:
    """One epoch as the training loop saw it.

    ``cpu`` is ``time.process_time()``: every thread of this process (the
    training process), never its worker processes. ``thread_cpu`` is the
    calling thread's alone (``time.thread_time()``).
    """

    wall: float
    first: float
    batches: int
    items: int
    cpu: float
    thread_cpu: float

    @property
    def items_per_s(self) -> float:
        return self.items / self.wall


def run_epoch(
    loader: Iterable[Any],
    since: Clock | None = None,
    visit: Callable[[Any], None] | None = None,
    size: Callable[[Any], int] = len,
) -> Epoch:
    """Iterate ``loader`` once; times count from ``since`` (default: now).

    Pass ``since=Clock.now()`` taken before building the loader to include its
    start-up. ``visit`` sees every batch (for checksums); its time is counted.
    ``size(batch)`` is the number of items in a batch (``len`` by default; for
    collated ``(inputs, labels)`` pairs pass e.g. ``lambda b: len(b[1])``).
    """
    start = since or Clock.now()
    first = None
    batches = items = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start.wall
        batches += 1
        items += size(batch)
        if visit is not None:
            visit(batch)
    end = Clock.now()
    wall = end.wall - start.wall
    return Epoch(
        wall=wall,
        first=wall if first is None else first,
        batches=batches,
        items=items,
        cpu=end.cpu - start.cpu,
        thread_cpu=end.thread_cpu - start.thread_cpu,
    )


def shutdown(loader: Any) -> None:
    """Shut a pipeloom loader down (torch's loaders have no ``shutdown``)."""
    close = getattr(loader, "shutdown", None)
    if close is not None:
        close()


def quiet_torch_warnings() -> None:
    """torch warns when num_workers exceeds the CPU count; the comparison is deliberate."""
    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)


# --- formatting ----------------------------------------------------------------------------


def rate(per_second: float) -> str:
    """``155k/s``-style throughput."""
    if per_second >= 1e6:
        return f"{per_second / 1e6:.2f}M/s"
    if per_second >= 1e4:
        return f"{per_second / 1e3:.0f}k/s"
    return f"{per_second:,.0f}/s"


def ratio(ours: float, theirs: float) -> str:
    """``ours / theirs`` as ``1.23x`` (pass speeds: > 1 means ours is faster)."""
    return f"{ours / theirs:.2f}x"


def _append_markdown(text: str) -> None:
    path = os.environ.get(MARKDOWN_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(text)


def print_table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    lines = [
        f"\n## {title}\n",
        "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(str(x).ljust(w) for x, w in zip(row, widths)) + " |")
    text = "\n".join(lines)
    print(text, flush=True)
    _append_markdown(text.replace("\n## ", "\n### ", 1) + "\n")


def note(text: str) -> None:
    """A line of explanation under a table: printed, and kept in the markdown file."""
    print(f"\n{text}", flush=True)
    _append_markdown(f"\n{text}\n")
