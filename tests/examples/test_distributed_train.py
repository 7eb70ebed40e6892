"""examples/distributed_train.py trains under torchrun with two CPU ranks."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.reading_service.distributed_ranks import free_port

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "distributed_train.py"


@pytest.mark.timeout(300)  # a hang detector: two ranks importing torch on a busy machine
def test_ddp_example_runs_under_torchrun_and_shards_every_epoch():
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(EXAMPLE),
        "--epochs=2",
        "--samples=500",
        "--check",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(EXAMPLE.parents[1]))
    done = subprocess.run(command, capture_output=True, text=True, timeout=280, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    # 500 samples in batches of 32, built in the workers from runs of 32 positions:
    # 16 runs, 8 per rank (the last one short), so 8 steps on both ranks, every sample once
    assert "epoch 1: items per rank [256, 244], distinct 500" in done.stdout
    assert done.stdout.count("over 8 steps per rank") == 2
    losses = [float(x) for x in re.findall(r"mean loss ([0-9.]+)", done.stdout)]
    assert len(losses) == 2 and losses[1] < losses[0]
