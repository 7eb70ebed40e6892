"""Module-level pipeline builders and functions, importable by spawned workers."""

from __future__ import annotations

import os
import select
import threading

import numpy as np

from pipeloom import get_worker_info
from pipeloom.datapipes import IterableWrapper, IterDataPipe, SequenceWrapper, item_rng


def augmented(n: int = 40, batch: int = 4):
    """Shuffle, shard, draw per item, filter, two outputs per input, batch."""
    return (
        IterableWrapper(range(n))
        .shuffle()
        .sharding_filter()
        .map(lambda x: (x, int(item_rng().integers(1000))))
        .filter(lambda t: t[0] % 3 != 0)
        .flatmap(lambda t: [t, t])
        .batch(batch)
    )


def explode_at_seven(x):
    if x == 7:
        raise KeyError("bad sample")
    return x


def global_numpy_draw(_):
    return int(np.random.randint(0, 2**31))


class PidOfLazyInit(IterDataPipe):
    """Yields the PID of the process where lazy_init ran, once per item."""

    def __init__(self, n):
        self.n = n
        self.pid = None

    def lazy_init(self):
        self.pid = os.getpid()

    def __iter__(self):
        for _ in range(self.n):
            yield self.pid


def kill_self_at(x, at=3):
    if x == at:
        os.kill(os.getpid(), 9)
    return x


def stall_at_0_and_kill_self_at_1(x):
    """Worker 0 stalls on item 0 while worker 1 kills itself on item 1."""
    if x == 0:
        select.select([], [], [], 20)  # sleeps; the merge waits for this item
    if x == 1:
        os.kill(os.getpid(), 9)
    return x


def draw(x):
    return (x, int(item_rng().integers(1000)))


def draws_on_both_sides_of_the_merge(n: int = 30):
    """item_rng() is used in the workers' part and again after the merge."""
    return (
        IterableWrapper(range(n))
        .sharding_filter()
        .map(draw)
        .filter(lambda t: t[0] % 4 != 1)
        .batch(3)
        .map(lambda batch: (batch, int(item_rng().integers(1000))))
    )


def batched_in_workers(n: int = 37):
    """map is one-to-one, so batch and collate run in the workers."""
    return IterableWrapper(range(n)).shuffle().sharding_filter().map(draw).batch(4).map(tuple)


# -- lifecycle tests (test_lifecycle.py) --------------------------------------

BIG_ITEM_BYTES = 4 << 20


def big_array(x):
    """A 4 MiB array whose every byte says which item it is."""
    return np.full(BIG_ITEM_BYTES // 8, x, dtype=np.float64)


def pid_of_worker(x):
    info = get_worker_info()
    return (x, os.getpid(), None if info is None else info.id)


def stuck_at(x, at=0, release_fd=None):
    """Item ``at`` waits until ``release_fd`` is readable, at most a minute: its worker is stuck.

    A pipe, not a ``multiprocessing.Event``: setting an Event whose waiter was
    SIGKILLed blocks forever.
    """
    if x == at:
        if release_fd is None:
            threading.Event().wait(60)
        else:
            select.select([release_fd], [], [], 60)
    return x


def slow_item(x):
    """Item ``x`` takes 10 ms: workers are always mid-item when the consumer stops."""
    threading.Event().wait(0.01)
    return x


def logged_open(log_path, path, *args, **kwargs):
    """``open`` that first appends ``"<pid> <path>"`` to ``log_path`` (one line per open)."""
    with open(log_path, "a") as log:
        log.write(f"{os.getpid()} {path}\n")
    return open(path, *args, **kwargs)  # noqa: SIM115 - the caller owns the stream


def sample_and_worker(sample):
    info = get_worker_info()
    return (sample["__key__"], sample["cls"], sample["json"], None if info is None else info.id)


def for_strategies(n: int = 23, batch: int = 4, drop_last: bool = False, map_style: bool = False):
    """Shuffled (or indexed) source, a per-item random augmentation, batch + collate."""
    from pipeloom.datapipes import SequenceWrapper

    if map_style:
        source = SequenceWrapper(list(range(n))).to_iter()
    else:
        source = IterableWrapper(range(n)).shuffle().sharding_filter()
    return source.map(draw).batch(batch, drop_last=drop_last).collate()


def kill_self_in_collate(batch):
    os.kill(os.getpid(), 9)


class PidOnRead(SequenceWrapper):
    """A map-style source whose items are the PID of the process that read them."""

    def __getitem__(self, index):
        return os.getpid()


def member_name(member):
    path, _stream = member
    return os.path.basename(str(path))


def global_draws(x):
    """Draws from the three global RNGs (what random transforms do)."""
    import random

    import torch

    return (random.random(), float(np.random.rand()), float(torch.rand(())))


class RaisesAfter:
    """An iterable of ``range(n)`` whose iterator raises ``ValueError`` after ``at`` items."""

    def __init__(self, n: int, at: int) -> None:
        self.n, self.at = n, at

    def __iter__(self):
        yield from range(min(self.n, self.at))
        if self.at < self.n:
            raise ValueError(f"source broke after {self.at} items")


def source_error_after(n: int, batch: int, at: int):
    """A source of ``n`` items that fails after ``at`` of them, a per-item draw, batch, collate."""
    return IterableWrapper(RaisesAfter(n, at)).sharding_filter().map(draw).batch(batch).collate()
