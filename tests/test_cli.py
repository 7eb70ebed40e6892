"""``python -m pipeloom``: ``demo`` and ``profile``, run as a user runs them (subprocesses)."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
HAS_TQDM = importlib.util.find_spec("tqdm") is not None

PIPELINES = """
import time
import pipeloom
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import ThreadReadingService

def fast(x):
    return x

def slow(x):
    time.sleep(0.01)
    return x

def build():
    return IterableWrapper(range(200)).sharding_filter().map(fast).map(slow).batch(4)

def loader():
    return pipeloom.DataLoader(build(), ThreadReadingService(2), seed=0)
"""
# Runs python -m pipeloom with tqdm and matplotlib unimportable.
WITHOUT_OPTIONAL = (
    "import runpy, sys; sys.modules.update(tqdm=None, matplotlib=None); "
    "runpy.run_module('pipeloom', run_name='__main__')"
)


def run_cli(tmp_path, *args, hide_optional=False, timeout=60):
    (tmp_path / "user_pipelines.py").write_text(PIPELINES)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    env.pop("PIPELOOM_STATS_DIR", None)
    command = (
        [sys.executable, "-c", WITHOUT_OPTIONAL, *args]
        if hide_optional
        else [sys.executable, "-m", "pipeloom", *args]
    )
    return subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.timeout(90)
def test_demo_reads_the_same_shards_every_way_and_checks_the_output(tmp_path):
    done = run_cli(tmp_path, "demo", "--quick", timeout=80)
    assert done.returncode == 0, done.stderr
    for name in ("in-process", "threads", "classic", "economic", "chunked", "torch DataLoader"):
        assert f"{name}" in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith(("pipeloom ", "torch "))]
    assert len(rows) == 8 and all(line.endswith("yes") for line in rows), done.stdout
    assert "identical output everywhere: yes" in done.stdout
    assert (
        "pipeloom autotuned" in done.stdout
        and "autotuned (DataLoader(pipe, 'auto')): ended on" in done.stdout
    )
    assert list(tmp_path.iterdir()) == [tmp_path / "user_pipelines.py"]  # cleaned up after itself


@pytest.mark.timeout(60)
def test_profile_prints_the_stats_and_writes_the_report(tmp_path):
    out = tmp_path / "out"
    args = ("profile", "user_pipelines:build", "--workers", "2", "--strategy", "threads")
    done = run_cli(tmp_path, *args, "--batches", "20", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "verdict: loader-bound: Mapper(slow) in the worker threads" in done.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["target"] == "user_pipelines:build"
    assert report["stats"]["outputs"] == 20 and report["stats"]["service"] == "threads"
    assert report["stats"]["stages"][0]["stage"] == "Mapper(slow)"
    assert "strategy: threads" in report["placement"]
    assert (out / "placement.dot").read_text().startswith("digraph")
    assert (out / "timeline.png").exists() == HAS_MATPLOTLIB
    if HAS_TQDM:
        assert "batch" in done.stderr


@pytest.mark.timeout(60)
def test_profile_works_without_the_optional_packages(tmp_path):
    out = tmp_path / "out"
    done = run_cli(
        tmp_path,
        "profile",
        "user_pipelines:build",
        "--batches",
        "10",
        "--out",
        str(out),
        hide_optional=True,
    )
    assert done.returncode == 0, done.stderr
    assert "profile: 10/10 batches" in done.stderr  # the plain progress line
    assert "timeline: not drawn (matplotlib is not installed" in done.stdout
    assert not (out / "timeline.png").exists() and (out / "report.json").exists()
    assert "verdict: loader-bound" in done.stdout


@pytest.mark.timeout(60)
def test_profile_auto_tunes_a_loader_the_function_returned_and_reports_the_choice(tmp_path):
    out = tmp_path / "out"
    done = run_cli(tmp_path, "profile", "user_pipelines:loader", "--auto", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "autotune chose: " in done.stdout or "autotune: best measured " in done.stdout
    assert "autotune: " in done.stdout  # the stats table's line, with the trials
    report = json.loads((out / "report.json").read_text())["stats"]["autotune"]
    assert report["config"]["kind"] in ("threads", "processes")
    assert report["budget"]["cpus"] >= 1


@pytest.mark.timeout(60)
def test_profile_auto_starts_where_workers_and_strategy_say(tmp_path):
    out = tmp_path / "out"
    args = ("profile", "user_pipelines:build", "--auto", "--strategy", "classic", "--workers", "1")
    done = run_cli(tmp_path, *args, "--batches", "3", "--out", str(out))
    assert done.returncode == 0, done.stderr
    trials = json.loads((out / "report.json").read_text())["stats"]["autotune"]
    assert trials["replacements"] == 0  # 3 batches: too few to measure, still the start
    config = {"kind": "processes", "workers": 1, "prefetch": 2, "strategy": "classic"}
    assert trials["config"] == {**config, "chunk_size": None}
