"""AutoReadingService: re-placing an epoch between outputs never changes the output."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeloom
from pipeloom.autotune import AutoReadingService, Budget, Config, Tuner
from pipeloom.datapipes import IterableWrapper
from pipeloom.errors import StateError
from pipeloom.reading_service import (
    MultiProcessingReadingService,
    SequentialReadingService,
    ThreadReadingService,
)
from tests.autotune.shards import write_number_shards


class Scripted(Tuner):
    """Switches to ``plan[k]`` after the ``k``-th output of the run (counted over epochs)."""

    def __init__(self, plan: dict[int, Config]) -> None:
        self.plan = plan
        self.outputs = 0
        self.started: list[Config] = []

    def start(self, config: Config) -> None:
        self.started.append(config)

    def observe(self, now: float, wait_s: float, output_bytes: int) -> Config | None:
        self.outputs += 1
        return self.plan.get(self.outputs)


def square(x):
    return x * x


def odd(x):
    return x % 2 == 1


def draw(x):  # uses the item's random stream: must not depend on placement either
    return x, int(pipeloom.item_rng().integers(1000))


def build(n=40, shuffle=True, keep_odd=False, batch=4, random=False):
    pipe = IterableWrapper(range(n))
    if shuffle:
        pipe = pipe.shuffle()
    pipe = pipe.sharding_filter().map(draw if random else square)
    if keep_odd:
        pipe = pipe.filter(lambda x: odd(x[0] if isinstance(x, tuple) else x))
    return pipe.batch(batch) if batch else pipe


configs = st.builds(
    Config,
    st.just("threads"),
    st.integers(1, 3),
    st.integers(1, 3),
)


@pytest.mark.timeout(120)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 30),
    shuffle=st.booleans(),
    keep_odd=st.booleans(),
    batch=st.sampled_from([0, 1, 3, 4]),
    random=st.booleans(),
    seed=st.integers(0, 2**16),
    start=configs,
    plan=st.dictionaries(st.integers(1, 12), configs, max_size=4),
)
def test_any_re_placement_gives_the_in_process_output(
    n, shuffle, keep_odd, batch, random, seed, start, plan
):
    def make():
        return build(n, shuffle, keep_odd, batch, random)

    untuned = pipeloom.DataLoader(make(), seed=seed)
    reference = [list(untuned), list(untuned)]  # epochs 0 and 1
    service = AutoReadingService(start=start, tuner=Scripted(plan))
    with pipeloom.DataLoader(make(), service, seed=seed) as tuned:
        assert [list(tuned), list(tuned)] == reference


@pytest.mark.timeout(60)
def test_re_placement_between_threads_and_processes_keeps_the_output():
    plan = {
        2: Config("processes", 2, 1),
        5: Config("threads", 3, 2),
        7: Config("processes", 1, 3),
        11: Config("threads", 1, 1),
    }
    reference = list(pipeloom.DataLoader(build(60, random=True), seed=3))
    service = AutoReadingService(start=Config("threads", 1, 1), tuner=Scripted(plan))
    with pipeloom.DataLoader(build(60, random=True), service, seed=3) as tuned:
        assert list(tuned) == reference
        assert service.replacements == 4
        assert tuned.placement().strategy == "threads"
        assert service.config == Config("threads", 1, 1)


@pytest.mark.timeout(60)
def test_the_choice_is_saved_and_a_resumed_job_starts_tuned():
    service = AutoReadingService(
        start=Config("threads", 1, 1), tuner=Scripted({2: Config("processes", 2, 3)})
    )
    reference = list(pipeloom.DataLoader(build(), seed=5))
    with pipeloom.DataLoader(build(), service, seed=5) as loader:
        iterator = iter(loader)
        seen = [next(iterator) for _ in range(4)]
        state = loader.state_dict()
    assert state["autotune"] == {"config": Config("processes", 2, 3).to_dict(), "settled": False}
    state = torch.load(_saved(state), weights_only=True)
    resumed_service = AutoReadingService()
    with pipeloom.DataLoader(build(), resumed_service, seed=0) as resumed:
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert resumed.placement().strategy == "classic"
    assert resumed_service.config == Config("processes", 2, 3)
    assert seen + rest == reference


def _saved(state):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "plain",
    [ThreadReadingService(2), MultiProcessingReadingService(2)],
    ids=["threads", "processes"],
)
def test_checkpoints_move_between_auto_and_plain_services(plain):
    reference = list(pipeloom.DataLoader(build(), seed=9))
    with pipeloom.DataLoader(
        build(), AutoReadingService(start=Config("threads", 3, 1)), seed=9
    ) as a:
        iterator = iter(a)
        head = [next(iterator) for _ in range(3)]
        state = a.state_dict()
    with pipeloom.DataLoader(build(), plain, seed=0) as b:
        b.load_state_dict(state)
        iterator = iter(b)
        middle = [next(iterator) for _ in range(3)]
        state = b.state_dict()
    service = AutoReadingService(start=Config("threads", 1, 1))
    with pipeloom.DataLoader(build(), service, seed=0) as c:
        c.load_state_dict(state)
        assert head + middle + list(c) == reference
        assert service.config == Config("threads", 1, 1)  # a plain state carries no choice


def test_a_resumed_job_starts_settled_on_its_saved_choice():
    service = AutoReadingService(start=Config("threads", 1, 1))
    service.load_tuning_state({"config": Config("threads", 2, 2).to_dict(), "settled": True})
    assert service.tuner.settled
    assert service.config == Config("threads", 2, 2)


@pytest.mark.parametrize(
    "saved",
    [
        None,
        {},
        {"config": {"kind": "gpus", "workers": 1, "prefetch": 1}},
        {"config": {"kind": "threads"}},
    ],
)
def test_a_damaged_choice_is_refused(saved):
    with pytest.raises(StateError, match="autotuned configuration is damaged"):
        AutoReadingService().load_tuning_state(saved)


def test_loader_accepts_auto_and_explains_other_strings():
    with pipeloom.DataLoader(build(8), "auto", seed=0) as loader:
        assert isinstance(loader.reading_service, AutoReadingService)
        assert list(loader) == list(pipeloom.DataLoader(build(8), seed=0))
    with pytest.raises(TypeError, match="or \"auto\", got 'fast'"):
        pipeloom.DataLoader(build(8), "fast")


def test_a_pipeline_without_sharding_point_runs_in_process():
    pipe = IterableWrapper(range(5)).map(square)
    with pipeloom.DataLoader(pipe, "auto", seed=0, stats=True) as loader:
        assert list(loader) == [0, 1, 4, 9, 16]
        report = loader.stats().autotune
    assert report["config"] is None
    assert "nothing to tune" in report["chosen"] and "sharding point" in report["chosen"]


@pytest.mark.timeout(60)
def test_stats_report_the_choice_and_the_trials():
    plan = {3: Config("threads", 2, 2)}
    service = AutoReadingService(start=Config("threads", 1, 1), tuner=Scripted(plan))
    with pipeloom.DataLoader(build(40), service, seed=0, stats=True) as loader:
        list(loader)
        stats = loader.stats()
    assert stats.autotune["config"] == Config("threads", 2, 2).to_dict()
    assert stats.autotune["config"]["strategy"] == "classic"
    assert stats.autotune["replacements"] == 1
    assert stats.autotune["budget"]["cpus"] >= 1
    assert "autotune: 2 worker threads, prefetch 2" in str(stats)
    assert stats.to_dict()["autotune"]["chosen"] == "2 worker threads, prefetch 2"


def test_arguments_are_checked():
    with pytest.raises(TypeError, match="start must be"):
        AutoReadingService(start=("threads", 2))
    with pytest.raises(TypeError, match="budget must be"):
        AutoReadingService(budget={"cpus": 2})
    with pytest.raises(TypeError, match="tuner must be"):
        AutoReadingService(tuner=object())
    with pytest.raises(ValueError, match="workers"):
        Config("threads", 0)
    with pytest.raises(ValueError, match="kind"):
        Config("gpus", 1)
    with pytest.raises(TypeError, match="unknown budget field"):
        Budget.of_this_machine(cores=3)
    assert Budget.of_this_machine(cpus=3).max_threads == 24


def test_a_start_beyond_the_budget_is_refused():
    budget = Budget(
        cpus=2, memory_bytes=2**30, shared_memory_bytes=2**30, max_threads=8, max_processes=2
    )
    with pytest.raises(
        ValueError, match=r"asks for 3 worker processes.*at most 2.*max_processes=3"
    ):
        AutoReadingService(start=Config("processes", 3), budget=budget)
    with pytest.raises(ValueError, match=r"at most 8 \(Budget.max_threads\)"):
        AutoReadingService(start=Config("threads", 9), budget=budget)
    assert AutoReadingService(start=Config("threads", 8), budget=budget).config.workers == 8


def member_sample(sample):
    return int(sample["num"]), int(pipeloom.item_rng().integers(1000))


@pytest.mark.timeout(120)
def test_a_tar_pipeline_moves_from_threads_to_whole_batch_processes(tmp_path):
    """Threads batch in the main process, processes in the workers: the move needs no replay."""
    write_number_shards(tmp_path, [5 + shard for shard in range(4)])

    def make():
        return (
            pipeloom.datapipes.FileLister(str(tmp_path), "*.tar")
            .shuffle()
            .sharding_filter()
            .open_files("rb")
            .load_from_tar()
            .webdataset()
            .map(member_sample)
            .batch(3)
        )

    plan = {2: Config("processes", 2, 2), 5: Config("threads", 2, 1)}
    service = AutoReadingService(start=Config("threads", 1, 1), tuner=Scripted(plan))
    with pipeloom.DataLoader(make(), service, seed=4) as loader:
        got = list(loader)
    assert got == list(pipeloom.DataLoader(make(), seed=4))
    assert service.failures == [] and service.replacements == 2
    with pytest.raises(RuntimeError, match="before initialize"):
        AutoReadingService().placement()


def test_a_choice_made_on_an_epochs_last_output_starts_the_next_epoch():
    tuner = Scripted({10: Config("threads", 2, 3)})  # 40 items in batches of 4: 10 outputs
    service = AutoReadingService(start=Config("threads", 1, 1), tuner=tuner)
    untuned = pipeloom.DataLoader(build(), seed=2)
    expected = [list(untuned), list(untuned)]
    with pipeloom.DataLoader(build(), service, seed=2) as loader:
        first = [batch for _, batch in zip(range(10), loader)]  # never asks past the 10th
        assert service.pending == Config("threads", 2, 3)
        assert [first, list(loader)] == expected
        assert service.config == Config("threads", 2, 3)
        assert service.replacements == 0  # placed at the epoch's start, not mid-epoch
    assert tuner.started == [Config("threads", 1, 1), Config("threads", 2, 3)]


def test_a_choice_made_on_the_last_output_is_placed_before_the_end_is_read():
    tuner = Scripted({10: Config("processes", 1, 1)})
    service = AutoReadingService(start=Config("threads", 1, 1), tuner=tuner)
    untuned = pipeloom.DataLoader(build(), seed=2)
    expected = [list(untuned), list(untuned)]
    with pipeloom.DataLoader(build(), service, seed=2) as loader:
        assert [list(loader), list(loader)] == expected
        assert service.replacements == 1
        assert loader.placement().strategy == "classic"


@pytest.mark.timeout(60)
def test_worker_processes_started_by_a_re_placement_report_their_statistics():
    service = AutoReadingService(
        start=Config("threads", 1, 1), tuner=Scripted({1: Config("processes", 2, 2)})
    )
    pipe = IterableWrapper(range(400)).sharding_filter().map(python_work).batch(4)
    with pipeloom.DataLoader(pipe, service, seed=0, stats=True) as loader:
        list(loader)
    stats = loader.stats()  # after shutdown: the workers wrote their last report
    assert service.replacements == 1
    assert any(use.placement == "worker processes" for use in stats.processes), stats.processes


def python_work(x):
    return sum(i * x for i in range(3000))


any_configs = st.builds(
    Config, st.sampled_from(["threads", "processes"]), st.integers(1, 2), st.integers(1, 3)
)


@pytest.mark.timeout(180)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 40),
    keep_odd=st.booleans(),
    batch=st.sampled_from([0, 2, 5]),
    seed=st.integers(0, 2**16),
    start=any_configs,
    plan=st.dictionaries(st.integers(1, 10), any_configs, min_size=1, max_size=3),
)
def test_re_placement_across_threads_and_processes_gives_the_in_process_output(
    n, keep_odd, batch, seed, start, plan
):
    def make():
        return build(n, True, keep_odd, batch, True)

    reference = list(pipeloom.DataLoader(make(), seed=seed))
    service = AutoReadingService(start=start, tuner=Scripted(plan))
    with pipeloom.DataLoader(make(), service, seed=seed) as tuned:
        assert list(tuned) == reference


def test_chained_in_a_sequential_service_it_is_still_saved_and_reported():
    tuner = Scripted({2: Config("threads", 2, 2)})
    auto = AutoReadingService(start=Config("threads", 1, 1), tuner=tuner)
    with pipeloom.DataLoader(build(), SequentialReadingService(auto), seed=0, stats=True) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(3)]
        state = loader.state_dict()
        assert loader.stats().autotune["config"] == Config("threads", 2, 2).to_dict()
    assert state["autotune"]["config"] == Config("threads", 2, 2).to_dict()
    resumed = AutoReadingService()
    with pipeloom.DataLoader(build(), SequentialReadingService(resumed), seed=0) as loader:
        loader.load_state_dict(state)
        assert head + list(loader) == list(pipeloom.DataLoader(build(), seed=0))
    assert resumed.config == Config("threads", 2, 2)


@pytest.mark.timeout(60)
def test_a_configuration_that_cannot_start_is_reported_and_the_epoch_goes_on(monkeypatch):
    def refuse(self, pipeline):
        raise RuntimeError("cannot send this pipeline to worker processes")

    monkeypatch.setattr(MultiProcessingReadingService, "initialize", refuse)
    tuner = Scripted({3: Config("processes", 2, 2), 6: Config("threads", 2, 1)})
    service = AutoReadingService(start=Config("threads", 1, 1), tuner=tuner)
    with pipeloom.DataLoader(build(random=True), service, seed=4) as loader:
        assert list(loader) == list(pipeloom.DataLoader(build(random=True), seed=4))
    assert service.failures == [
        "2 worker processes, prefetch 2: RuntimeError: cannot send this pipeline to worker "
        "processes"
    ]
    assert service.config == Config("threads", 2, 1) and service.replacements == 1
    assert service.autotune_report()["failures"] == service.failures


@pytest.mark.timeout(120)
def test_a_move_to_another_strategy_waits_for_the_next_epoch():
    plan = {3: Config("processes", 2, 2, "chunked")}
    service = AutoReadingService(start=Config("threads", 1, 1), tuner=Scripted(plan))
    reference = pipeloom.DataLoader(build(40, random=True), seed=3)
    expected = [list(reference), list(reference)]
    with pipeloom.DataLoader(build(40, random=True), service, seed=3) as loader:
        first = list(loader)
        assert service.config == Config("threads", 1, 1)  # the epoch ended where it started
        second = list(loader)
        assert service.config.strategy == "chunked"
        assert service.config.chunk_size is not None  # the plan's default, resolved
        assert "chunked" in str(loader.placement())
    assert [first, second] == expected
    assert service.failures == []


@pytest.mark.timeout(120)
def test_a_strategy_the_pipeline_cannot_run_is_reported_and_the_run_goes_on():
    plan = {2: Config("processes", 2, 2, "economic")}  # economic refuses a filter
    service = AutoReadingService(start=Config("threads", 2, 1), tuner=Scripted(plan))
    reference = pipeloom.DataLoader(build(40, keep_odd=True, batch=2), seed=3)
    expected = [list(reference), list(reference)]
    with pipeloom.DataLoader(build(40, keep_odd=True, batch=2), service, seed=3) as loader:
        got = [list(loader), list(loader)]
    assert got == expected
    assert service.config == Config("threads", 2, 1)
    assert len(service.failures) == 1 and "economic" in service.failures[0]


any_configs = st.one_of(
    configs,
    st.builds(Config, st.just("processes"), st.integers(1, 2), st.integers(1, 2)),
    st.builds(
        Config,
        st.just("processes"),
        st.integers(1, 2),
        st.integers(1, 2),
        st.sampled_from(["economic", "chunked"]),
    ),
)


@pytest.mark.timeout(240)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 24),
    batch=st.sampled_from([1, 3, 4]),
    seed=st.integers(0, 2**16),
    plan=st.dictionaries(st.integers(1, 14), any_configs, max_size=4),
)
def test_moves_across_strategies_give_the_in_process_output(n, batch, seed, plan):
    untuned = pipeloom.DataLoader(build(n, batch=batch, random=True), seed=seed)
    reference = [list(untuned), list(untuned), list(untuned)]
    service = AutoReadingService(start=Config("threads", 1, 1), tuner=Scripted(plan))
    with pipeloom.DataLoader(build(n, batch=batch, random=True), service, seed=seed) as tuned:
        assert [list(tuned), list(tuned), list(tuned)] == reference
    assert service.failures == []
