"""pipeloom.compat.DataLoader yields torch's batches: same indices, order and values."""

from __future__ import annotations

import functools
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.compat import STRATEGIES, DataLoader
from tests.compat.compat_cases import (
    BatchedItems,
    Items,
    Range,
    Unsharded,
    WorkerAware,
    pairs_collate,
    run_both,
    same,
    sampling,
    shard_by_worker_init,
)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 20), case=st.data(), custom_collate=st.booleans())
def test_in_process_batches_equal_torchs_for_every_sampler(n, case, custom_collate):
    name, make = case.draw(sampling(n), label="sampling")
    common = {"collate_fn": pairs_collate} if custom_collate and "None" not in name else {}
    theirs, ours = run_both(Items(n), make, common=common)
    assert same(theirs, ours), name


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 14), case=st.data())
def test_worker_process_batches_equal_torchs(strategy, n, case):
    name, make = case.draw(sampling(n), label="sampling")
    per_item = "batch_size=None" not in name and not name.startswith("batch_sampler")
    # economic and chunked fetch item by item, so they need batch_size (not a batch_sampler);
    # the default strategy falls back to classic there, as checked below.
    extra = {"strategy": strategy} if per_item or strategy == "classic" else {}
    theirs, ours = run_both(Items(n), make, common={"num_workers": 2}, ours=extra)
    assert same(theirs, ours), name


@pytest.mark.parametrize("strategy", ["economic", "chunked"])
def test_item_by_item_strategies_refuse_a_batch_sampler_and_say_why(strategy):
    sampler = torch.utils.data.BatchSampler(range(6), 2, False)
    with pytest.raises(ValueError, match=r"batch_sampler .* fixes each batch's indices"):
        DataLoader(Items(6), batch_sampler=sampler, num_workers=2, strategy=strategy)


def test_map_style_datasets_default_to_classic_and_item_strategies_are_opt_in():
    assert DataLoader(Items(6), batch_size=2, num_workers=2).strategy == "classic"
    sampler = torch.utils.data.BatchSampler(range(6), 2, False)
    assert DataLoader(Items(6), batch_sampler=sampler, num_workers=2).strategy == "classic"
    chosen = DataLoader(Items(6), batch_size=2, num_workers=2, strategy="economic")
    assert chosen.strategy == "economic"


@settings(max_examples=5, deadline=None)
@given(n=st.integers(1, 14), case=st.data())
def test_worker_thread_batches_equal_torchs(n, case):
    name, make = case.draw(sampling(n), label="sampling")
    theirs, ours = run_both(
        Items(n), make, common={"num_workers": 2}, ours={"worker_type": "thread"}
    )
    assert same(theirs, ours), name


@pytest.mark.parametrize("num_workers", [0, 2])
def test_getitems_is_used_as_torch_uses_it(num_workers):
    def make():
        return {"batch_size": 3, "shuffle": True, "generator": torch.Generator().manual_seed(4)}

    theirs, ours = run_both(BatchedItems(10), make, common={"num_workers": num_workers})
    assert same(theirs, ours)
    assert theirs[0][0][0][1].tolist() == [-3, -3, -3]


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_info_seeds_and_global_rng_in_workers_match_torchs(persistent):
    def make():
        return {"batch_size": 2, "shuffle": True, "num_workers": 2}

    theirs, ours = run_both(
        WorkerAware(9),
        make,
        common={"persistent_workers": persistent},
        ours={"strategy": "classic"},  # torch's batch-per-worker placement
    )
    assert same(theirs, ours)
    first_batch = ours[0][0][0]
    assert first_batch["worker"].tolist() == [0, 0] and first_batch["workers"].tolist() == [2, 2]
    assert all(first_batch["same_dataset"].tolist())


def test_worker_info_is_none_in_process_as_in_torch():
    batch = next(iter(DataLoader(WorkerAware(3), batch_size=3)))
    assert batch["worker"].tolist() == [-1, -1, -1]


@pytest.mark.parametrize("num_workers", [0, 1, 2])
@pytest.mark.parametrize(
    "batch_size, drop_last", [(None, False), (1, False), (4, False), (4, True)]
)
def test_iterable_dataset_sharded_by_get_worker_info_matches_torch(
    num_workers, batch_size, drop_last
):
    def make():
        return {"batch_size": batch_size, "drop_last": drop_last, "num_workers": num_workers}

    theirs, ours = run_both(Range(3, 22), make)
    assert same(theirs, ours)


def test_iterable_dataset_sharded_by_worker_init_fn_matches_torch():
    def make():
        return {"batch_size": 3, "num_workers": 2, "worker_init_fn": shard_by_worker_init}

    theirs, ours = run_both(Unsharded(0, 17), make)
    assert same(theirs, ours)  # the floats come from each worker's seeded torch RNG
    items = sorted(int(i) for batch in ours[0][0] for i in batch[0])
    assert items == list(range(17))


SPAWN_CHECK = """
import sys

from tests.compat.compat_cases import WorkerAware, run_both, same

def make():
    return dict(batch_size=2, shuffle=True, num_workers=2,
                multiprocessing_context="spawn", timeout=60)

if __name__ == "__main__":
    theirs, ours = run_both(WorkerAware(7), make, count=1, ours=dict(strategy="classic"))
    sys.exit(0 if same(theirs, ours) else 1)
"""


@pytest.mark.timeout(400)  # a hang detector: spawned workers import torch, slow on a busy machine
def test_spawned_workers_yield_torchs_batches(tmp_path):
    # In a fresh interpreter: spawn-context semaphores of either loader may outlive
    # the test (in /dev/shm) and its resource tracker.
    script = tmp_path / "spawn_check.py"
    script.write_text(SPAWN_CHECK)
    root = str(pathlib.Path(__file__).parents[2])  # the repository: ``tests`` is a package there
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(script)], env=env, timeout=360, cwd=root)
    assert done.returncode == 0


def test_pin_memory_passes_batches_through_without_an_accelerator():
    make = functools.partial(dict, batch_size=2, pin_memory=True)
    with pytest.warns(UserWarning, match="pin_memory"):  # torch's warning (ours is silent)
        theirs, ours = run_both(Items(5), make)
    assert same(theirs, ours)
