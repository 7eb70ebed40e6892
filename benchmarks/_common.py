"""Shared helpers for the benchmarks: timing, tables, a torch dataset of indices."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch.utils.data


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


def print_table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    print(f"\n## {title}\n")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(str(x).ljust(w) for x, w in zip(row, widths)) + " |")
