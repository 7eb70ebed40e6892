"""Output, seeds and checkpoints do not depend on the interpreter's string-hash seed.

Every Python process hashes strings with its own seed (``PYTHONHASHSEED``):
set order, ``hash(str)`` and whatever derives from them differ between two
runs of a script, between a process and its spawned workers, and between the
ranks of a job. In-process tests cannot see that, so two interpreters with
seeds 1 and 2 (``cross_interpreter_job.py``, run side by side) describe many
pipelines -- string keys in groupby, demux, random_split and key_zip, tar
shards through webdataset, file listers, a set of strings as the source,
functions, partials, bound methods and a callable object of ``__main__``
holding a set -- and everything must
match byte for byte: the items, the fingerprint a checkpoint records, the
digest the ranks compare, the snapshot cache's fingerprint, the pickled state
after 3 items, and the items 2 spawned workers (another seed again) read.
This interpreter (a third seed) then resumes each state exactly.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import pickle
import subprocess
import sys

import pytest

from pipeloom import DataLoader
from pipeloom._fingerprint import pipeline_fingerprint
from pipeloom._rank_pipelines import digest, rank_description
from tests import cross_interpreter_job as job

JOB = pathlib.Path(__file__).with_name("cross_interpreter_job.py")
REPO = str(pathlib.Path(__file__).resolve().parents[1])
SEEDS = (1, 2)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    job.write_shards(str(root))
    runs = []
    for seed in SEEDS:
        out = tmp_path_factory.mktemp(f"hash-seed-{seed}") / "report.json"
        path = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONHASHSEED": str(seed), "PYTHONPATH": path}
        command = [sys.executable, str(JOB), str(root), str(out)]
        runs.append((subprocess.Popen(command, env=env, stderr=subprocess.PIPE), out))
    found = []
    for process, out in runs:
        try:
            _, stderr = process.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
        assert process.returncode == 0, stderr.decode()[-3000:]
        found.append(json.loads(out.read_text()))
    return str(root), found


def test_the_interpreters_hash_strings_differently(reports):
    _, (one, two) = reports
    assert one["hash"] != two["hash"]
    assert one["hash"] not in one["worker_hashes"]  # spawned workers: another seed again
    assert two["hash"] not in two["worker_hashes"]


@pytest.mark.parametrize("name", job.NAMES)
def test_a_pipeline_is_the_same_under_another_hash_seed(reports, name):
    _, (one, two) = reports
    for field in ("items", "fingerprint", "rank_digest", "cache_fingerprint", "state"):
        assert one["pipelines"][name][field] == two["pipelines"][name][field], (
            f"{name}: {field} depends on the interpreter's hash seed"
        )
    assert len(json.loads(one["pipelines"][name]["fingerprint"])["blocks"]) > 1


@pytest.mark.parametrize("name", job.SPAWNED)
def test_spawned_workers_with_another_hash_seed_read_the_same_items(reports, name):
    _, (one, two) = reports
    assert one["spawned"][name] == one["pipelines"][name]["items"]
    assert two["spawned"][name] == two["pipelines"][name]["items"]


@pytest.mark.parametrize("name", job.NAMES)
def test_a_state_saved_in_another_interpreter_resumes_exactly_here(reports, name):
    root, (one, _) = reports
    saved = one["pipelines"][name]
    pipeline = job.build(name, root)
    assert json.dumps(pipeline_fingerprint(pipeline), sort_keys=True) == saved["fingerprint"]
    assert digest(rank_description(job.build(name, root), False)) == saved["rank_digest"]
    loader = DataLoader(pipeline, seed=job.SEED)
    loader.load_state_dict(pickle.loads(base64.b64decode(saved["state"])))
    assert repr(list(loader)) == saved["rest"]
