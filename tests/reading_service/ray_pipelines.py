"""Module-level functions for the Ray tests, importable by the actors."""

from __future__ import annotations

import os
import signal
import threading
import warnings
from collections.abc import Iterator

import numpy as np

import pipeloom
from pipeloom.datapipes import IterDataPipe, item_rng


def kill_once(x, at, marker):
    """SIGKILL the calling process at item ``at`` the first time only (``marker`` remembers)."""
    if x == at and not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def stuck_once(x, at, marker):
    """Item ``at`` waits a minute the first time only (``marker`` gets the stuck pid)."""
    if x == at and not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        threading.Event().wait(60)
    return x


def kill_twice(x, at, marker):
    """SIGKILL the calling process at item ``at`` the first two times (``marker`` counts)."""
    if x == at:
        with open(marker, "a+") as f:
            f.seek(0)
            if len(f.read()) >= 2:
                return x
            f.write("x")
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def kill_always(x, at):
    if x == at:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def with_pid(x):
    return x, os.getpid()


def counted(x, path):
    """Append a line to ``path`` per item made (what a producer has made so far)."""
    with open(path, "a") as f:
        f.write("x\n")
    return x


def who(x):
    info = pipeloom.get_worker_info()
    return x, info.id, info.num_workers, int(np.random.randint(0, 2**31))


def array_of(x):
    return np.full((4, 4), x, dtype=np.float32) + np.float32(item_rng().random())


def wide(x):
    return [x, -x]


def odd(x):
    return x % 2 == 1


class LazyPid(IterDataPipe):
    """Yields ``(i, pid of the process where lazy_init ran)``."""

    def __init__(self, n):
        self.n = n
        self.pid = None

    def lazy_init(self):
        self.pid = os.getpid()

    def __iter__(self):
        for i in range(self.n):
            yield i, self.pid


def init_marks(worker_id):
    assert pipeloom.get_worker_info().id == worker_id


def drawn_where(name):
    """``(name, an item_rng() draw, the pid that drew it)``."""
    return name, int(item_rng().integers(1000)), os.getpid()


def copies(t):
    """400 marked copies of ``t``: more than an actor's buffers hold (runs of 64)."""
    return [(f"{t[0]}#{j}", *t[1:]) for j in range(400)]


def not_member_1(t):
    return not t[0].endswith("-1.bin")


def local_cluster(temp_dir: str) -> Iterator[None]:
    """A small local Ray cluster (2 CPUs, no dashboard) for one test module's fixture:
    ``yield from local_cluster(path)``; stopped after the module."""
    import ray

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ray.init(
            num_cpus=2,
            object_store_memory=80 * 2**20,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            _temp_dir=temp_dir,
        )
    try:
        yield
    finally:
        ray.shutdown()
