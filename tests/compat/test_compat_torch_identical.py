"""With default arguments the compat loader yields torch's batches, global-RNG draws included.

The dataset is shaped like an ImageNet training set: ``__getitem__`` draws a
random crop and a flip from torch's global RNG and colour jitter from
``random`` and NumPy's global RNG, so its values depend on which process
draws them and in which order -- exactly torch's per-worker streams.
"""

from __future__ import annotations

import os
import pathlib
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.utils.data as tud

from pipeloom.compat import STRATEGIES, DataLoader
from tests.compat.compat_cases import epochs, same


class Augmented(tud.Dataset):
    """A tiny "image" per index, randomly cropped, flipped and jittered from the global RNGs."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = torch.arange(3 * 8 * 8, dtype=torch.float32).reshape(3, 8, 8) + index
        top, left = torch.randint(0, 3, (2,)).tolist()
        crop = image[:, top : top + 6, left : left + 6]
        if torch.rand(()) < 0.5:
            crop = crop.flip(-1)
        brightness = random.uniform(0.8, 1.2)
        contrast = float(np.random.uniform(0.8, 1.2))
        return crop * brightness * contrast, index % 10


def run_both(dataset, make, *, seed, common=None, ours=None):
    """Two epochs from torch's loader and from ours, every global RNG seeded alike first.

    In-process, ``__getitem__`` draws from the main process's ``random`` and
    NumPy streams, so those are seeded too (not only torch's).
    """
    results = []
    for cls, extra in ((tud.DataLoader, {}), (DataLoader, ours or {})):
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        loader = cls(dataset, **make(), **(common or {}), **extra)
        try:
            results.append((epochs(loader, 2), float(torch.rand(())), random.random()))
        finally:
            if hasattr(loader, "shutdown"):
                loader.shutdown()
    return results[0], results[1]


def shuffled(batch_size: int = 4, **extra):
    def make():
        return {"batch_size": batch_size, "shuffle": True, **extra}

    return make


def distributed(rank: int):
    def make():
        sampler = tud.distributed.DistributedSampler(
            range(22), num_replicas=2, rank=rank, shuffle=True, seed=7
        )
        return {"batch_size": 3, "sampler": sampler}

    return make


def test_the_default_strategy_is_torchs_design():
    assert DataLoader(Augmented(8), batch_size=2, num_workers=2).strategy == "classic"
    assert DataLoader(Augmented(8), batch_size=2).strategy == "classic"


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")  # torch's
@pytest.mark.parametrize(
    "num_workers, persistent", [(0, False), (2, False), (2, True), (4, False), (4, True)]
)
def test_global_rng_augmentations_equal_torchs_by_default(num_workers, persistent):
    common = {"num_workers": num_workers, "persistent_workers": persistent}
    theirs, ours = run_both(Augmented(22), shuffled(), seed=3, common=common)
    assert same(theirs, ours)
    flips = {bool(x[0, 0, 0, 0] > x[0, 0, 0, -1]) for epoch in ours[0] for x, _ in epoch}
    assert flips == {True, False}  # the augmentation really drew both ways


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("rank", [0, 1])
def test_distributed_sampler_ranks_equal_torchs_by_default(num_workers, rank):
    theirs, ours = run_both(
        Augmented(22), distributed(rank), seed=5, common={"num_workers": num_workers}
    )
    assert same(theirs, ours)


@pytest.mark.timeout(120)
def test_an_explicit_generator_and_drop_last_equal_torchs_by_default():
    def make():
        return {
            "batch_size": 5,
            "shuffle": True,
            "drop_last": True,
            "generator": torch.Generator().manual_seed(11),
        }

    theirs, ours = run_both(Augmented(23), make, seed=0, common={"num_workers": 2})
    assert same(theirs, ours)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "classic"])
def test_item_by_item_strategies_are_reproducible_but_not_torchs_streams(strategy):
    """What the docs say they change: the same values at any worker count, not torch's."""
    runs = {}
    for workers in (2, 3):
        torch.manual_seed(3)
        with DataLoader(
            Augmented(22), batch_size=4, shuffle=True, num_workers=workers, strategy=strategy
        ) as loader:
            runs[workers] = list(loader)
    assert same(runs[2], runs[3])
    theirs, ours = run_both(
        Augmented(22), shuffled(), seed=3, common={"num_workers": 2}, ours={"strategy": strategy}
    )
    labels = [[b[1].tolist() for b in run[0][0]] for run in (theirs, ours)]
    assert labels[0] == labels[1]  # the same samples
    assert not same(theirs, ours)  # drawn from other streams


SPAWN_CHECK = """
import sys

from tests.compat.compat_cases import same
from tests.compat.test_compat_torch_identical import Augmented, run_both, shuffled

if __name__ == "__main__":
    make = shuffled(multiprocessing_context="spawn", timeout=60)
    common = dict(num_workers=2, persistent_workers=True)  # one start per loader
    theirs, ours = run_both(Augmented(10), make, seed=9, common=common)
    sys.exit(0 if same(theirs, ours) else 1)
"""


@pytest.mark.timeout(400)  # a hang detector: spawned workers import torch, slow on a busy machine
def test_spawned_workers_equal_torchs_by_default(tmp_path):
    # A fresh interpreter: spawn-context semaphores may outlive the test in /dev/shm.
    script = tmp_path / "spawn_check.py"
    script.write_text(SPAWN_CHECK)
    root = str(pathlib.Path(__file__).parents[2])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(script)], env=env, timeout=360, cwd=root)
    assert done.returncode == 0
