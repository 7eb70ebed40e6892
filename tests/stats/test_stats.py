"""``loader.stats()``: wait attribution, readiness and the verdict, in every placement.

Stages sleep (a stand-in for work that is the same on every machine); the
bounds are generous, and nothing is asserted about speed itself.
"""

from __future__ import annotations

import json
import math
import threading
import time

import pytest

import pipeloom
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from pipeloom.stats import Headspace, LoaderStats
from tests.stats import ranks


def fast(x):
    return x


def sleeper(seconds: float):
    def stage(x):
        time.sleep(seconds)
        return x

    return stage


def slow(x):
    time.sleep(0.03)
    return x


def run(pipe, service, *, step: float) -> LoaderStats:
    with pipeloom.DataLoader(pipe, service, seed=0, stats=True) as loader:
        for _ in loader:
            time.sleep(step)  # the training step
    return loader.stats()  # after shutdown: every worker wrote its last report


def producer_consumer(stage_s: float, items: int = 30):
    return IterableWrapper(range(items)).sharding_filter().map(sleeper(stage_s))


@pytest.mark.timeout(60)
def test_a_stage_slower_than_the_consumer_makes_the_loader_the_bottleneck():
    # 60 ms against 20 ms: sleeps overshoot on a loaded machine (35 ms against 30 ms
    # failed once at load 7)
    stats = run(producer_consumer(0.06, items=20), ThreadReadingService(1), step=0.02)
    assert stats.loader_bound, stats
    assert stats.readiness is not None and stats.readiness <= 0.10, stats
    assert stats.verdict.startswith("loader-bound: Mapper(stage) in the worker threads"), stats


@pytest.mark.timeout(60)
def test_a_consumer_slower_than_the_stage_makes_the_consumer_the_bottleneck():
    stats = run(producer_consumer(0.01, items=30), ThreadReadingService(1), step=0.04)
    assert not stats.loader_bound, stats
    assert stats.readiness is not None and stats.readiness >= 0.90, stats
    assert stats.verdict.startswith("consumer-bound: the loader is ready"), stats


def one_slow_map_among_fast_ones(items: int = 24):
    return IterableWrapper(range(items)).sharding_filter().map(fast).map(slow).map(fast).batch(2)


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("service", "placement"),
    [
        (None, "main process"),
        (ThreadReadingService(2), "worker threads"),
        (MultiProcessingReadingService(2), "worker processes"),
    ],
    ids=["in-process", "threads", "processes"],
)
def test_the_wait_is_attributed_to_the_slow_stage(service, placement):
    stats = run(one_slow_map_among_fast_ones(), service, step=0.001)
    top = stats.stages[0]
    assert (top.stage, top.placement) == ("Mapper(slow)", placement), stats
    assert top.wait_share >= 0.80, stats
    assert math.isclose(sum(s.wait_share for s in stats.stages), 1.0, abs_tol=1e-9), stats
    assert stats.loader_bound, stats
    assert stats.outputs == 12


@pytest.mark.timeout(60)
def test_the_record_is_printable_and_serialisable():
    stats = run(one_slow_map_among_fast_ones(8), ThreadReadingService(1), step=0.0)
    text = str(stats)
    assert "verdict: " + stats.verdict in text and "Mapper(slow)" in text
    again = json.loads(json.dumps(stats.to_dict()))
    assert again["outputs"] == 4 and again["verdict"] == stats.verdict
    assert stats.stage("slow") is stats.stages[0]
    with pytest.raises(KeyError, match="no stage named like 'decode'"):
        stats.stage("decode")
    with pytest.raises(AttributeError):
        stats.outputs = 5  # frozen


def test_stats_must_be_asked_for():
    with pipeloom.DataLoader(IterableWrapper(range(3))) as loader:
        assert list(loader) == [0, 1, 2]
        with pytest.raises(RuntimeError, match=r"stats=True"):
            loader.stats()


def test_statistics_do_not_change_the_output():
    pipe = IterableWrapper(range(20)).shuffle().sharding_filter().map(fast).batch(3)
    with pipeloom.DataLoader(pipe, ThreadReadingService(2), seed=3) as plain:
        expected = list(plain)
    with pipeloom.DataLoader(pipe, ThreadReadingService(2), seed=3, stats=True) as counted:
        assert list(counted) == expected
        assert counted.stats().outputs == len(expected)


@pytest.mark.timeout(60)
def test_a_distributed_job_names_the_slow_rank(tmp_path):
    results = ranks.launch(2, str(tmp_path))
    for rank, result in enumerate(results):
        assert isinstance(result, dict), (rank, result)
        assert [r["straggler"] for r in result["ranks"]] == [False, True], result
        assert "rank 1 is the straggler" in result["verdict"], result


@pytest.mark.timeout(60)
def test_worker_processes_report_their_cpu_and_memory():
    stats = run(one_slow_map_among_fast_ones(8), MultiProcessingReadingService(2), step=0.0)
    uses = {use.placement: use for use in stats.processes}
    assert uses["main process"].processes == 1
    assert uses["worker processes"].processes == 2, stats
    assert uses["worker processes"].peak_rss_mib > 0 and stats.shared_memory_mib >= 0
    assert "worker processes (2):" in str(stats)


@pytest.mark.timeout(60)
def test_forkserver_workers_report_to_the_loader_that_started_them():
    # forkserver's children inherit the server's environment, not the loader's: the server,
    # started by an earlier loader (or before any), knows no report directory or a stale one.
    # (Python 3.14's default start method on Linux.)
    for _ in range(2):
        service = MultiProcessingReadingService(2, start_method="forkserver")
        stats = run(one_slow_map_among_fast_ones(8), service, step=0.0)
        uses = {use.placement: use for use in stats.processes}
        assert uses["worker processes"].processes == 2, stats


@pytest.mark.timeout(60)
def test_headspace_measures_the_step_without_loading():
    pipe = IterableWrapper(range(12)).map(slow)  # 30 ms of loading per output
    with pipeloom.DataLoader(pipe, stats=True) as loader:
        replayed = Headspace(loader, cache=4, replays=8)
        seen = []
        for item in replayed:
            time.sleep(0.005)  # the training step
            seen.append(item)
        stats = loader.stats()
    assert seen == [0, 1, 2, 3] * 3
    loop = (stats.wait_s + stats.step_s) / stats.outputs
    assert stats.headspace_step_s == replayed.step_s
    assert stats.headspace_step_s < loop / 2, stats  # no 30 ms of loading in it
    assert "headspace: best-case step" in str(stats)


def test_headspace_checks_its_arguments():
    with pipeloom.DataLoader(IterableWrapper(range(3)), stats=True) as loader:
        with pytest.raises(ValueError, match="cache"):
            Headspace(loader, cache=0, replays=1)
        assert list(Headspace(loader, cache=5, replays=2)) == [0, 1, 2, 0, 1]


def sampler_running() -> bool:
    return any(t.name == "pipeloom-stats-sampler" for t in threading.enumerate())


def test_the_sampler_runs_only_while_a_loader_with_statistics_reads_an_epoch():
    pipe = IterableWrapper(range(4))
    with pipeloom.DataLoader(pipe) as plain:
        seen = [sampler_running() for _ in plain]
    assert seen == [False] * 4
    with pipeloom.DataLoader(pipe, stats=True) as counted:
        seen = [sampler_running() for _ in counted]
        assert not sampler_running()  # the epoch ended
        items = iter(counted)
        next(items)
        assert sampler_running()
    assert seen == [True] * 4
    assert not sampler_running()  # shutdown closed the open epoch
    assert counted.stats().outputs == 5
