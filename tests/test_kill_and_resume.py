"""A training process killed after a checkpoint resumes exactly in a new process."""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import sys

import pytest

from pipeloom import DataLoader
from pipeloom.reading_service import MultiProcessingReadingService
from tests import checkpoint_job
from tests.own_resources import wait_for_exit

JOB = pathlib.Path(__file__).with_name("checkpoint_job.py")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(JOB), *map(str, args)], timeout=120)


def batches(path: pathlib.Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.timeout(420)  # two training processes; generous for a busy machine
def test_sigkilled_training_resumes_from_its_checkpoint_in_a_new_process(tmp_path):
    full, partial, checkpoint = tmp_path / "full", tmp_path / "partial", tmp_path / "ckpt.pt"
    # The uninterrupted epoch: the job's "full" mode, run here (no third interpreter)
    with DataLoader(checkpoint_job.build(), MultiProcessingReadingService(2), seed=11) as loader:
        checkpoint_job.write(str(full), loader)
    crashed = run("crash", partial, checkpoint, 5)
    assert crashed.returncode == -signal.SIGKILL
    assert run("resume", partial, checkpoint).returncode == 0
    assert batches(partial) == batches(full)
    assert len(batches(full)) == 15

    # the killed job's worker processes notice their parent is gone and exit
    worker_pids = json.loads((tmp_path / "partial.pids").read_text())
    still_running = wait_for_exit(worker_pids, timeout=15)
    assert still_running == [], f"orphaned workers still alive: {still_running}"
