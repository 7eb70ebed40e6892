"""Process targets for the queue tests (importable under spawn/forkserver).

Targets that use torch first call ``torch.set_num_threads(1)``: a child forked
from a parent that ran OpenMP-parallel torch ops hangs in its next parallel
region (a libgomp limitation, unrelated to the queues).
"""

from __future__ import annotations

import os
import signal

import numpy as np
import torch


def produce_range(q, n):
    for i in range(n):
        q.put(i, timeout=10)
    q.close()


def produce_payloads(q, n):
    torch.set_num_threads(1)
    for i in range(n):
        q.put({"t": torch.full((1000, 100), float(i)), "a": (np.arange(30000) + i, i)}, timeout=10)
    q.close()


def produce_lambda(q):
    offset = 5
    q.put(lambda x: x + offset, timeout=10)
    q.close()


def produce_then_die(q, n):
    torch.set_num_threads(1)
    for i in range(n):
        q.put(torch.full((100_000,), float(i)), timeout=10)
    os.kill(os.getpid(), signal.SIGKILL)


def consume_then_die(q, n, ready):
    for _ in range(n):
        q.get(timeout=10)
    ready.set()
    os.kill(os.getpid(), signal.SIGKILL)


def consume_all(q, out):
    torch.set_num_threads(1)
    items = []
    while True:
        item = q.get(timeout=10)
        if item is None:
            break
        items.append(float(item.sum()))
    out.put(items)
    q.close()


def try_put(q, out):
    try:
        q.put(1, timeout=5)
        out.put("ok")
    except RuntimeError as err:
        out.put(f"RuntimeError: {err}")


def die_now():
    os.kill(os.getpid(), signal.SIGKILL)


def produce_built(q, n):
    """Fill tensors made by ``q.empty_tensor`` (shared memory) and put them."""
    torch.set_num_threads(1)
    for i in range(n):
        t = q.empty_tensor((256, 1024), torch.float32)
        t.fill_(float(i))
        q.put({"i": i, "t": t}, timeout=10)
        del t
    q.close()


def put_until_refused(q, out):
    """Fill ``q``, say so, then put once more (it blocks for room); report how it ended."""
    for _ in range(q.capacity):
        q.put(0)
    out.put("full")
    try:
        q.put(0, timeout=30)
        out.put("put")
    except Exception as error:  # noqa: BLE001 - reported to the test
        out.put(type(error).__name__)
