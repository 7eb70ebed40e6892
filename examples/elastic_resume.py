"""Save a checkpoint on one number of ranks, resume the epoch on another.

Two ranks read 40% of an epoch and save one job checkpoint; three ranks
resume it (or any other number)::

    torchrun --nproc_per_node=2 examples/elastic_resume.py --save ckpt.pt --steps 4
    torchrun --nproc_per_node=3 examples/elastic_resume.py --resume ckpt.pt

Saving: every rank calls ``loader.state_dict()`` at the same step, the states
are gathered (``torch.distributed.all_gather_object``) and joined with
``merge_rank_states``; rank 0 writes the one file. Resuming: every rank loads
that file, whatever the number of ranks. The samples no rank delivered are
split among the new ranks, each delivered exactly once; the next epoch is the
one a fresh job with the new number of ranks reads. ``--check`` (with
``--resume``) verifies it on rank 0: the samples before and after the
checkpoint are every sample of the epoch, once.
"""

from __future__ import annotations

import argparse
import datetime

import torch
import torch.distributed as dist

import pipeloom
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import (
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
    merge_rank_states,
)

SAMPLES, BATCH = 96, 4


def build_pipeline():
    return (
        IterableWrapper(range(SAMPLES))
        .shuffle()  # before the sharding point: the same order on every rank
        .sharding_filter()  # the positions each rank (and worker) keeps
        .map(lambda index: index * 10)  # per item, in the workers
        .batch(BATCH)  # built in the workers from runs of BATCH positions
    )


def make_loader(workers: int) -> pipeloom.DataLoader:
    service = SequentialReadingService(
        DistributedReadingService(timeout=60),
        MultiProcessingReadingService(workers, start_method="forkserver"),
    )
    return pipeloom.DataLoader(build_pipeline(), service, seed=0)


def save(path: str, steps: int, workers: int) -> None:
    with make_loader(workers) as loader:
        iterator = iter(loader)
        seen = [x for _ in range(steps) for x in next(iterator)]
        states: list = [None] * dist.get_world_size()
        dist.all_gather_object(states, loader.state_dict())
        delivered: list = [None] * dist.get_world_size()
        dist.all_gather_object(delivered, seen)
    if dist.get_rank() == 0:
        job = merge_rank_states(states)  # one state for the whole job
        torch.save({"loader": job, "delivered": delivered}, path)


def resume(path: str, workers: int, check: bool) -> None:
    checkpoint = torch.load(path, weights_only=False)
    with make_loader(workers) as loader:
        loader.load_state_dict(checkpoint["loader"])
        rest = [x for batch in loader for x in batch]  # the rest of the saved epoch
        following = [x for batch in loader for x in batch]  # the next epoch
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (rest, following))
    if dist.get_rank() == 0:
        rests = [r for r, _ in gathered]
        before = [x for seen in checkpoint["delivered"] for x in seen]
        after = [x for r in rests for x in r]
        print(
            f"before the checkpoint {len(before)} samples on {len(checkpoint['delivered'])} "
            f"ranks; after it {[len(r) for r in rests]} on {len(rests)} ranks"
        )
        if check:
            assert sorted(before + after) == [i * 10 for i in range(SAMPLES)]
            assert sorted(x for _, f in gathered for x in f) == [i * 10 for i in range(SAMPLES)]
            print("every sample of the epoch exactly once")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", help="read --steps batches per rank, write the checkpoint")
    parser.add_argument("--resume", help="resume the checkpoint, read the epoch and the next")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2, help="worker processes per rank")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    # torchrun sets MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE; gloo runs on CPU.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        if args.save:
            save(args.save, args.steps, args.workers)
        else:
            resume(args.resume, args.workers, args.check)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
