"""A stand-in training job for the kill-and-resume test.

python checkpoint_job.py full   OUT            # an uninterrupted epoch
python checkpoint_job.py crash  OUT CKPT K     # K batches, checkpoint, SIGKILL itself
python checkpoint_job.py resume OUT CKPT       # resume from CKPT to the end
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch

from pipeloom import DataLoader, get_worker_info
from pipeloom.datapipes import IterableWrapper, item_rng
from pipeloom.reading_service import MultiProcessingReadingService


def augment(x):
    info = get_worker_info()
    return {"x": x, "noise": int(item_rng().integers(1000)), "pid": os.getpid() if info else 0}


def build():
    return (
        IterableWrapper(range(60))
        .shuffle()
        .sharding_filter()
        .map(augment)
        .shuffle(buffer_size=7)
        .batch(4)
    )


def write(out, batches):
    with open(out, "a") as handle:
        for batch in batches:
            handle.write(json.dumps([[s["x"], s["noise"]] for s in batch]) + "\n")


def main() -> None:
    mode, out = sys.argv[1], sys.argv[2]
    loader = DataLoader(build(), MultiProcessingReadingService(2), seed=11)
    if mode == "full":
        write(out, loader)
    elif mode == "crash":
        checkpoint, count = sys.argv[3], int(sys.argv[4])
        iterator = iter(loader)
        batches = [next(iterator) for _ in range(count)]
        write(out, batches)
        pids = sorted({s["pid"] for batch in batches for s in batch})
        with open(out + ".pids", "w") as handle:
            json.dump(pids, handle)
        torch.save(loader.state_dict(), checkpoint)
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "resume":
        loader.load_state_dict(torch.load(sys.argv[3], weights_only=False))
        write(out, loader)
    loader.shutdown()


if __name__ == "__main__":
    main()
