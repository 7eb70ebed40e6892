"""Rank programs for test_elastic_ranks.py: save on one number of ranks, resume on another.

:func:`launch` starts ``world`` ranks (gloo, 127.0.0.1) through
``distributed_ranks.fork_ranks``; each runs its phases (``save`` or
``resume``) in turn over every case and writes each phase's results to its
directory. ``save`` takes every rank's ``loader.state_dict()`` after ``step``
items, gathers them with ``torch.distributed.all_gather_object`` and joins
them with ``merge_rank_states``; ``resume`` loads the joined state on the new
ranks.
"""

from __future__ import annotations

import datetime
import faulthandler
import io
import os
import pickle
import tarfile
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from pipeloom import DataLoader
from pipeloom.datapipes import FileLister, IterableWrapper
from pipeloom.reading_service import (
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
    ThreadReadingService,
    merge_rank_states,
)
from tests.reading_service.distributed_ranks import RankLauncher, fork_ranks, free_port

SEED = 7
TARS, MEMBERS = 6, 4


def write_tars(root: str) -> None:
    for shard in range(TARS):
        with tarfile.open(os.path.join(root, f"shard-{shard}.tar"), "w") as tar:
            for i in range(MEMBERS):
                data = f"{shard}.{i}".encode()
                info = tarfile.TarInfo(f"doc{shard}_{i}.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def plain(root: str):
    return IterableWrapper(range(60)).shuffle().sharding_filter().map(lambda x: x * 10)


def tars(root: str):  # mid-shard checkpoints: several members per sharded file
    shards = FileLister(root, "*.tar").sharding_filter().open_files("rb").load_from_tar()
    return shards.map(lambda member: member[1].decode())


def mixed_and_packed(root: str):  # 48 documents of 4 tokens, mixed 2:1, packed 2 per row
    web = IterableWrapper([[i] * 4 for i in range(32)])
    code = IterableWrapper([[100 + i] * 4 for i in range(16)])
    rows = web.mux(code, weights=[2, 1], stop="all").pack(8)
    return rows.sharding_filter().map(lambda row: tuple(row[0].tolist()))


def row_length(row) -> int:
    return int((row[0] != 0).sum())


def tokens(batch) -> list:  # a batch of packed rows -> the documents' tokens in it (0 pads)
    return [int(t) for values, _, _ in batch for t in values.tolist() if t]


def lm(root: str):  # shuffle, pack and bucket after the sharding point: they hold items
    docs = IterableWrapper([[i + 1] * (i % 5 + 1) for i in range(48)])
    rows = docs.sharding_filter().shuffle(buffer_size=5).pack(8, buffer_size=3)
    return rows.bucket_by_length(row_length, boundaries=[6], batch_sizes=2).map(tokens)


PIPELINES: dict[str, Callable[[str], Any]] = {
    "plain": plain,
    "tars": tars,
    "mixed+packed": mixed_and_packed,
    "lm": lm,
}


def service(name: str, uneven: str = "shortest"):
    ranks = DistributedReadingService(uneven, end_check="step" if uneven == "pad" else "auto")
    if name == "alone":
        return ranks
    if name == "threads":
        return SequentialReadingService(ranks, ThreadReadingService(2))
    workers = MultiProcessingReadingService(2, start_method="forkserver", timeout=20)
    return SequentialReadingService(ranks, workers)


CASES = [  # (pipeline, service)
    ("plain", "alone"),
    ("plain", "processes"),
    ("plain", "threads"),
    ("tars", "alone"),
    ("tars", "processes"),
    ("tars", "threads"),
    ("mixed+packed", "alone"),
    ("mixed+packed", "threads"),
    ("lm", "alone"),
    ("lm", "processes"),
]


Phase = tuple[str, str, dict]
"""(``"save"`` or ``"resume"``, the directory of its states and results, steps per pipeline)."""


def launch(
    phases: list[Phase],
    world: int,
    root: str,
    *,
    limit: float = 200.0,
    launcher: RankLauncher | None = None,
) -> list[list]:
    """Run ``phases`` one after the other on the same ``world`` ranks (one job, so the
    ranks start once); for each phase, the results of rank 0, 1, ...

    ``root`` holds the tar shards; a ``resume`` phase reads the states the test wrote
    from an earlier job's ``save`` into its directory. ``launcher``: see ``fork_ranks``.
    """
    port = free_port()
    args = [(phases, rank, world, port, root, limit) for rank in range(world)]
    exitcodes = fork_ranks(_rank_main, args, limit, launcher)
    results = []
    for phase, out_dir, _ in phases:
        results.append([])
        for rank in range(world):
            path = os.path.join(out_dir, f"{phase}{rank}.pkl")
            if not os.path.exists(path):
                results[-1].append(("missing", exitcodes[rank]))
                continue
            with open(path, "rb") as file:
                results[-1].append(pickle.load(file))
    return results


def _rank_main(phases: list[Phase], rank, world, port, root, limit) -> None:
    faulthandler.dump_traceback_later(limit, exit=True)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=limit / 2),
    )
    for phase, out_dir, steps in phases:
        results: dict[Any, Any] = {}
        for pipeline, name in CASES:
            for step in steps[pipeline]:
                key = (pipeline, name, step)
                try:
                    if phase == "save":
                        results[key] = _save(pipeline, name, step, root, world)
                    else:
                        results[key] = _resume(pipeline, name, step, root, out_dir)
                except Exception as error:  # noqa: BLE001 - the test inspects it
                    results[key] = ("error", type(error).__name__, str(error))
        with open(os.path.join(out_dir, f"{phase}{rank}.pkl"), "wb") as file:
            pickle.dump(results, file)
    dist.destroy_process_group()


def _save(pipeline: str, name: str, step: int, root: str, world: int):
    """This rank's first ``step`` items; the job's state (every rank writes the same);
    whether the job's state resumes on the same ranks as the uninterrupted epoch goes on."""
    with DataLoader(PIPELINES[pipeline](root), service(name), seed=SEED) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(step)]
        states: list[Any] = [None] * world
        dist.all_gather_object(states, loader.state_dict())
        uninterrupted = list(iterator)
    job_state = merge_rank_states(states)
    with DataLoader(PIPELINES[pipeline](root), service(name)) as loader:
        loader.load_state_dict(job_state)
        same_ranks = list(loader) == uninterrupted
    return head, job_state, same_ranks


def _resume(pipeline: str, name: str, step: int, root: str, states: str):
    """(rest of the epoch, the next epoch, a fresh run's next epoch, the rest under pad)."""
    with open(os.path.join(states, f"state-{pipeline}-{name}-{step}.pkl"), "rb") as file:
        state = pickle.load(file)
    with DataLoader(PIPELINES[pipeline](root), service(name)) as loader:
        loader.load_state_dict(state)
        rest = list(loader)
        following = list(loader)
    with DataLoader(PIPELINES[pipeline](root), service(name), seed=SEED) as fresh:
        fresh.set_epoch(1)
        fresh_following = list(fresh)
    padded = None
    if pipeline in ("tars", "lm"):  # the rest splits unevenly: pad covers every item
        with DataLoader(PIPELINES[pipeline](root), service(name, "pad")) as loader:
            loader.load_state_dict(state)
            padded = list(loader)
    return rest, following, fresh_following, padded
