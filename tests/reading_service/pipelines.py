"""Module-level pipeline builders and functions, importable by spawned workers."""

from __future__ import annotations

import os

import numpy as np

from pipeloom.datapipes import IterableWrapper, IterDataPipe, item_rng


def augmented(n: int = 40):
    return (
        IterableWrapper(range(n))
        .shuffle()
        .sharding_filter()
        .map(lambda x: (x, int(item_rng().integers(1000))))
        .filter(lambda t: t[0] % 3 != 0)
        .flatmap(lambda t: [t, t])
        .batch(4)
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
