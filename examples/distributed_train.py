"""Data-parallel training (DDP) on CPU, each rank reading its own shard with pipeloom.

Run it on one machine with two ranks::

    torchrun --nproc_per_node=2 examples/distributed_train.py --epochs 2

and on N machines with the same code (run on each, ``--node_rank`` 0..N-1)::

    torchrun --nnodes=N --nproc_per_node=8 --node_rank=K \\
        --master_addr=HOST0 --master_port=29500 examples/distributed_train.py

The data set is synthetic (``y = x @ w_true + noise``, 2,000 samples). The
pipeline shuffles the sample indices (the same order on every rank: they
agree on one seed), shards them across ranks x workers, builds samples and
batches in worker processes, and ends every epoch on all ranks at the same
step, so DDP's gradient all-reduce never waits for a rank that ran out.
Rank 0 prints the loss per epoch and, with ``--check``, the items every rank
saw (each sample exactly once per epoch over all ranks).
"""

from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import pipeloom
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import (
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)

FEATURES = 8
W_TRUE = torch.arange(1.0, FEATURES + 1) / FEATURES


def make_sample(index: int) -> dict[str, torch.Tensor]:
    """Sample ``index`` of the synthetic regression set (deterministic in the index)."""
    generator = torch.Generator().manual_seed(index)
    x = torch.randn(FEATURES, generator=generator)
    noise = 0.01 * torch.randn((), generator=generator)
    return {"index": torch.tensor(index), "x": x, "y": x @ W_TRUE + noise}


def build_pipeline(samples: int, batch_size: int):
    return (
        IterableWrapper(range(samples))
        .shuffle()  # before the sharding point: identical on every rank
        .sharding_filter()  # rank r, worker i keeps its share
        .map(make_sample)  # per item: runs in the workers
        .batch(batch_size)
        .collate()
    )


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1, help="worker processes per rank")
    parser.add_argument("--check", action="store_true", help="verify the sharding on rank 0")
    args = parser.parse_args(argv)

    # torchrun sets MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE; gloo runs on CPU.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial model on every rank (DDP also broadcasts it)

    service = SequentialReadingService(
        DistributedReadingService(timeout=60),
        # forkserver: never fork a process that runs gloo's threads (see docs/distributed.md)
        MultiProcessingReadingService(args.workers, start_method="forkserver"),
    )
    loader = pipeloom.DataLoader(build_pipeline(args.samples, args.batch_size), service)
    model = DistributedDataParallel(torch.nn.Linear(FEATURES, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    losses = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        total, steps, seen = 0.0, 0, []
        for batch in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
            loss.backward()  # DDP averages the gradients over the ranks here
            optimizer.step()
            total, steps = total + loss.item(), steps + 1
            seen += batch["index"].tolist()
        losses.append(total / max(steps, 1))
        if args.check:
            everyone: list[list[int]] = [[] for _ in range(world)]
            dist.all_gather_object(everyone, seen)
            counts = [len(s) for s in everyone]
            union = sorted(i for s in everyone for i in s)
            assert len(set(union)) == len(union), "an item was read by two ranks"
            if rank == 0:
                print(f"epoch {epoch}: items per rank {counts}, distinct {len(union)}")
        if rank == 0:
            print(f"epoch {epoch}: mean loss {losses[-1]:.4f} over {steps} steps per rank")
    loader.shutdown()
    dist.destroy_process_group()
    return {"rank": rank, "world": world, "losses": losses, "pid": os.getpid()}


if __name__ == "__main__":
    main()
