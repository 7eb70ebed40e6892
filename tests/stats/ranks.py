"""A 2-rank gloo job for test_stats.py: each rank reads with statistics; rank 1 is slow."""

from __future__ import annotations

import datetime
import faulthandler
import os
import pickle
import socket
import time
from typing import Any

import torch.distributed as dist

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import DistributedReadingService

from ..reading_service.distributed_ranks import fork_ranks


def launch(world: int, out_dir: str, *, limit: float = 40.0) -> list[Any]:
    """Run :func:`_rank_main` in ``world`` ranks (``fork_ranks``); each one's result or why not."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = [(rank, world, port, out_dir, limit) for rank in range(world)]
    exitcodes = fork_ranks(_rank_main, args, limit)
    results = []
    for rank in range(world):
        path = os.path.join(out_dir, f"rank{rank}.pkl")
        if os.path.exists(path):
            with open(path, "rb") as file:
                results.append(pickle.load(file))
        else:
            results.append(("missing", exitcodes[rank]))
    return results


def _rank_main(rank: int, world: int, port: int, out_dir: str, limit: float) -> None:
    faulthandler.dump_traceback_later(limit, exit=True)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=limit / 2),
    )
    delay = 0.03 if rank == 1 else 0.002

    def load(x: int) -> int:
        time.sleep(delay)  # rank 1's storage is slow
        return x

    pipe = IterableWrapper(range(40)).sharding_filter().map(load)
    with DataLoader(pipe, DistributedReadingService(), seed=0, stats=True) as loader:
        for _ in loader:
            time.sleep(0.005)
        stats = loader.stats()
    result = {"verdict": stats.verdict, "ranks": [r.__dict__ for r in stats.ranks]}
    path = os.path.join(out_dir, f"rank{rank}.pkl")
    with open(path + ".tmp", "wb") as file:
        pickle.dump(result, file)
    os.replace(path + ".tmp", path)
    dist.destroy_process_group()
