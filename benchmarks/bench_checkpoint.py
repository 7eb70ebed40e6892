"""Checkpoint cost: save and resume at 90% of a 1-million-item shuffled epoch.

    python benchmarks/bench_checkpoint.py [--quick]

Compares pipeloom's exact resume (state_dict / load_state_dict) with replaying
the epoch from its start (what torch.utils.data.DataLoader users do), and
reports the size of the saved state.
"""

from __future__ import annotations

import argparse
import io
import time

import torch
from _common import print_table

import pipeloom
from pipeloom.datapipes import IterableWrapper


def build(n: int):
    return IterableWrapper(range(n)).shuffle(buffer_size=10_000).map(lambda x: x * 2).batch(64)


def main(argv: list[str] | None = None) -> list[list]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    n = 100_000 if args.quick else 1_000_000
    batches = -(-n // 64)
    stop = int(batches * 0.9)

    loader = pipeloom.DataLoader(build(n), seed=0)
    iterator = iter(loader)
    for _ in range(stop):
        next(iterator)
    start = time.perf_counter()
    state = loader.state_dict()
    save_s = time.perf_counter() - start
    buffer = io.BytesIO()
    torch.save(state, buffer)
    expected_next = next(iterator)

    start = time.perf_counter()
    loaded = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    resumed = pipeloom.DataLoader(build(n), seed=0)
    resumed.load_state_dict(loaded)
    first = next(iter(resumed))
    resume_s = time.perf_counter() - start
    assert first == expected_next

    start = time.perf_counter()
    replay = pipeloom.DataLoader(build(n), seed=0)
    iterator = iter(replay)
    for _ in range(stop):
        next(iterator)
    replayed_first = next(iterator)
    replay_s = time.perf_counter() - start
    assert replayed_first == expected_next

    rows = [
        ["state_dict()", f"{save_s * 1e3:.1f} ms", "-", "-"],
        ["torch.load(weights_only=True)", f"{load_s * 1e3:.1f} ms", "-", "-"],
        [
            "load_state_dict() to first batch",
            f"{resume_s * 1e3:.1f} ms",
            f"{replay_s * 1e3:.0f} ms",
            f"{replay_s / resume_s:.0f}x",
        ],
        ["saved state size", f"{len(buffer.getvalue()) / 1e3:.0f} kB", "-", "-"],
    ]
    print_table(
        f"checkpoint at 90% of a {n:,}-item shuffled epoch (batch 64)",
        ["what", "pipeloom exact resume", "replay from start", "speed-up"],
        rows,
    )
    return rows


if __name__ == "__main__":
    main()
