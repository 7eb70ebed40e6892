"""Attacks on autotune and its statistics from outside, as a user would run them.

Retunes are forced by a scripted tuner (no timing); worker processes use the
default start method (fork on Linux), each test with a short timeout.
"""

from __future__ import annotations

import pytest

import pipeloom
from pipeloom.autotune import AutoReadingService, Config, Tuner
from pipeloom.datapipes import IterableWrapper


class Scripted(Tuner):
    """Switches to ``plan[k]`` after the ``k``-th output of the run (counted over epochs)."""

    def __init__(self, plan: dict[int, Config]) -> None:
        self.plan = plan
        self.outputs = 0
        self.refused: list[Config] = []

    def start(self, config: Config) -> None:
        pass

    def observe(self, now: float, wait_s: float, output_bytes: int) -> Config | None:
        self.outputs += 1
        return self.plan.get(self.outputs)

    def rejected(self, config: Config, reason: str) -> None:
        self.refused.append(config)


def square(x):
    return x * x


def keep(x):
    return x % 5 != 0


@pytest.mark.timeout(30)
def test_a_start_strategy_the_pipeline_cannot_run_falls_back_to_classic_and_still_tunes():
    # economic refuses a filter before the batch; the run used to go in-process with
    # "nothing to tune", as if the pipeline had no sharding point, and never tuned.
    def make():
        return IterableWrapper(range(30)).shuffle().sharding_filter().map(square).filter(keep)

    tuner = Scripted({2: Config("threads", 2, 1)})
    service = AutoReadingService(start=Config("processes", 2, 1, "economic"), tuner=tuner)
    with pipeloom.DataLoader(make().batch(3), service, seed=1, stats=True) as loader:
        got = list(loader)
        report = loader.stats().autotune
    assert got == list(pipeloom.DataLoader(make().batch(3), seed=1))
    assert report["config"] == Config("threads", 2, 1).to_dict(), report["chosen"]
    assert service.replacements == 1
    assert tuner.refused == [Config("processes", 2, 1, "economic")]
    assert len(report["failures"]) == 1 and "economic" in report["failures"][0]
