"""examples/elastic_resume.py: saved by 2 ranks, resumed by 3 (and 3 by 2) under torchrun."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from tests.reading_service.distributed_ranks import free_port

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "elastic_resume.py"


def _torchrun(ranks: int, *args: str) -> str:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc_per_node={ranks}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(EXAMPLE),
        *args,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(EXAMPLE.parents[1]))
    done = subprocess.run(command, capture_output=True, text=True, timeout=140, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.timeout(300)  # a hang detector: ranks importing torch on a busy machine
# 2 -> 3 only: 3 -> 2 is checked in tests/reading_service/test_elastic_ranks.py (17 s saved)
@pytest.mark.parametrize(("old", "new", "steps"), [(2, 3, 3)])
def test_a_checkpoint_of_one_rank_count_resumes_on_another(tmp_path, old, new, steps):
    path = str(tmp_path / "ckpt.pt")
    _torchrun(old, "--save", path, f"--steps={steps}")
    out = _torchrun(new, "--resume", path, "--check")
    # 24 batches of 4: the saving ranks read `steps` each, the rest splits evenly
    rest = (24 - old * steps) * 4 // new
    assert f"before the checkpoint {old * steps * 4} samples on {old} ranks" in out
    assert f"after it {[rest] * new} on {new} ranks" in out
    assert "every sample of the epoch exactly once" in out
