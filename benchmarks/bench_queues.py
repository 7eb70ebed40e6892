"""Process-to-process throughput: pipeloom's ProcessQueue vs torch's and multiprocessing's.

Run:  python benchmarks/bench_queues.py            (full, about 1-2 minutes)
      python benchmarks/bench_queues.py --quick    (a few seconds per case)

Cases (the producer builds a *fresh* payload for every message, for every
implementation, and the consumer touches what it receives):

  tensor8m  one 8 MiB float32 tensor per message       (MB/s)
  dict16    a dict of 16 x 512 KiB float32 numpy arrays (MB/s)
  small     a tuple (int, str)                          (msg/s)

Each queue is bounded to the same capacity. The producer is a forked child,
the consumer the main process; timing starts after a short warm-up.

Allocation: torch's CPU allocator returns big blocks to the OS and faults
them in again on every allocation; on VMs a page fault can cost ~10 us, so a
fresh 8 MiB tensor alone can take longer than moving it. By default the
producer process therefore tunes glibc's malloc (mmap threshold) identically
for every implementation, so fresh tensors come from warm heap memory -- the
tensor is still new for every message. ``--raw-alloc`` turns that off.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import queue as queue_module
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as tmp
from _common import print_table

sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])
from pipeloom.queues import ProcessQueue  # noqa: E402

CAPACITY = 8
MIB = 1 << 20


def _tune_malloc() -> None:
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 256 * MIB)
    libc.mallopt(m_trim_threshold, 1024 * MIB)


def make_tensor(i: int) -> torch.Tensor:
    return torch.full((2 * MIB,), float(i), dtype=torch.float32)


def make_dict(i: int) -> dict[str, np.ndarray]:
    return {f"a{j}": np.full(128 * 1024, i + j, dtype=np.float32) for j in range(16)}


def make_small(i: int) -> tuple[int, str]:
    return (i, "item")


def touch_tensor(x: torch.Tensor) -> float:
    return float(x[0] + x[-1])


def touch_dict(x: dict[str, np.ndarray]) -> float:
    return float(sum(a[0] + a[-1] for a in x.values()))


def touch_small(x: tuple[int, str]) -> float:
    return float(x[0])


CASES: dict[str, tuple[Callable[[int], Any], Callable[[Any], float], int, int]] = {
    # name: (make, touch, bytes per message (0 = count messages), full message count)
    "tensor8m": (make_tensor, touch_tensor, 8 * MIB, 400),
    "dict16": (make_dict, touch_dict, 8 * MIB, 400),
    "small": (make_small, touch_small, 0, 200_000),
}


def _produce(q: Any, case: str, count: int, tune: bool, done: Any) -> None:
    if tune:
        _tune_malloc()
    make = CASES[case][0]
    for i in range(count):
        q.put(make(i))
    q.put(None)
    done.wait(60)  # torch's fd sharing needs the producer alive until all is received
    if isinstance(q, ProcessQueue):
        q.close()
    else:
        q.close()
        q.join_thread()


def _make_queue(impl: str) -> Any:
    if impl == "pipeloom":
        return ProcessQueue(CAPACITY, owner="consumer")
    if impl == "torch.mp":
        return tmp.get_context("fork").Queue(CAPACITY)
    return mp.get_context("fork").Queue(CAPACITY)


def run_one(impl: str, case: str, count: int, tune: bool) -> float:
    """Messages per second received by the consumer (after warm-up)."""
    touch = CASES[case][1]
    warmup = max(4, count // 20)
    q = _make_queue(impl)
    ctx = mp.get_context("fork")
    done = ctx.Event()
    proc = ctx.Process(target=_produce, args=(q, case, count + warmup, tune, done))
    proc.start()
    sink = 0.0
    for _ in range(warmup):
        sink += touch(q.get(timeout=60))
    start = time.perf_counter()
    got = 0
    while True:
        item = q.get(timeout=60)
        if item is None:
            break
        sink += touch(item)
        del item
        got += 1
    elapsed = time.perf_counter() - start
    done.set()
    proc.join(60)
    if isinstance(q, ProcessQueue):
        q.close()
    else:
        q.close()
        q.join_thread()
    assert got == count, (impl, case, got, count)
    return got / elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (~1/5 of the messages)")
    parser.add_argument(
        "--raw-alloc",
        action="store_true",
        help="do not tune malloc in the producer (fresh tensors page-fault)",
    )
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated cases")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    impls = ["pipeloom", "torch.mp", "mp"]
    rows = []
    for case in args.cases.split(","):
        _, _, nbytes, count = CASES[case]
        if args.quick:
            count = max(40, count // 5)
        rates = {impl: run_one(impl, case, count, not args.raw_alloc) for impl in impls}
        for impl in impls:
            rate = rates[impl]
            mbs = f"{rate * nbytes / 1e6:.0f}" if nbytes else "-"
            rows.append([case, impl, mbs, f"{rate:.0f}", f"{rate / rates['torch.mp']:.2f}x"])
    print_table(
        f"queues, process to process: capacity={CAPACITY}, malloc tuned in producer: "
        f"{not args.raw_alloc}, cpus={mp.cpu_count()}, torch {torch.__version__}",
        ["case", "impl", "MB/s", "msg/s", "vs torch.mp"],
        rows,
    )


if __name__ == "__main__":
    try:
        main()
    except queue_module.Empty:
        sys.exit("a queue timed out; the benchmark is broken")
