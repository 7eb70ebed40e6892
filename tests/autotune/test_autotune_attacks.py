"""Attacks on autotune and its statistics from outside, as a user would run them.

Retunes are forced by a scripted tuner (no timing); worker processes use the
default start method (fork on Linux), each test with a short timeout.
"""

from __future__ import annotations

import gc
import os

import pytest

import pipeloom
from pipeloom.autotune import AutoReadingService, Budget, Config, Tuner
from pipeloom.datapipes import FileLister, IterableWrapper
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from pipeloom.stats import counters
from tests.autotune.shards import write_number_shards
from tests.own_resources import OwnResources, dropped


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


def to_main(stats):
    return [q for q in stats.queues if q.name.endswith("-> main")]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "service",
    [
        lambda: ThreadReadingService(2),
        lambda: MultiProcessingReadingService(2),
        lambda: MultiProcessingReadingService(2, strategy="chunked"),
        lambda: AutoReadingService(
            start=Config("threads", 1, 1),
            tuner=Scripted(
                {
                    2: Config("processes", 2, 1),
                    4: Config("threads", 2, 2),
                    13: Config("processes", 1, 1),
                }
            ),
        ),
    ],
    ids=["threads", "classic", "chunked", "auto"],
)
def test_the_messages_counted_are_every_output_that_crossed(service):
    # A fast loop samples the queues every 10 ms: what crossed after a queue's last
    # sample (its epoch ended, autotune retired its workers) was lost, so two epochs of
    # 10 batches read by 2 worker processes showed some 11 messages.
    pipe = IterableWrapper(range(40)).sharding_filter().map(square).batch(4)
    with pipeloom.DataLoader(pipe, service(), seed=0, stats=True) as loader:
        outputs = sum(1 for _ in loader) + sum(1 for _ in loader)
        stats = loader.stats()
    assert stats.outputs == outputs == 20
    messages = sum(q.messages for q in to_main(stats))
    assert outputs <= messages <= outputs + 4 * len(to_main(stats)), to_main(stats)


@pytest.mark.timeout(30)
def test_a_configuration_retired_between_two_samples_still_has_its_messages_counted(monkeypatch):
    # No periodic sample at all: the processes placed at output 3 and retired at output 5
    # are only seen if autotune has their queues read before it stops them.
    monkeypatch.setattr(counters.QueueWatch, "maybe_sample", lambda self, now: None)
    plan = {2: Config("processes", 2, 1), 4: Config("threads", 1, 1)}
    service = AutoReadingService(start=Config("threads", 1, 1), tuner=Scripted(plan))
    pipe = IterableWrapper(range(40)).sharding_filter().map(square).batch(4)
    with pipeloom.DataLoader(pipe, service, seed=0, stats=True) as loader:
        assert sum(1 for _ in loader) == 10
        stats = loader.stats()
    assert service.replacements == 2
    processes = [q for q in to_main(stats) if q.name.startswith("worker process")]
    assert len(processes) == 2 and sum(q.messages for q in processes) >= 2, to_main(stats)
    assert sum(q.messages for q in to_main(stats)) >= 10, to_main(stats)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--auto", "--workers", "10000"], "allows at most"),
        (["--auto", "--strategy", "threads", "--workers", "100000"], "worker threads; give"),
        (["--auto", "--workers", "0"], "--auto starts with at least 1 worker, got --workers 0"),
        (["--strategy", "classic", "--workers", "0"], "--strategy classic needs at least 1"),
    ],
)
def test_profile_refuses_worker_counts_it_cannot_run_in_one_line(tmp_path, capsys, args, message):
    # --auto beyond the budget was a ValueError traceback and status 1; --workers 0 with a
    # strategy silently ran 2 workers (and --auto 1).
    from pipeloom.cli import main

    status = main(
        ["profile", "tests.autotune.test_autotune_attacks:small", *args, "--out", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert status == 2, err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "report.json").exists()


def small():
    return IterableWrapper(range(8)).sharding_filter().batch(2)


@pytest.mark.timeout(30)
def test_outputs_a_resume_replays_and_drops_are_not_counted_as_received():
    # A chunked state resumed under threads is replayed: the 6 batches delivered before
    # are made again and dropped. They were counted, so stats() said 10 outputs for 4.
    def make():
        return IterableWrapper(range(40)).shuffle().sharding_filter().map(square).batch(4)

    with pipeloom.DataLoader(make(), MultiProcessingReadingService(2, strategy="chunked")) as a:
        iterator = iter(a)
        head = [next(iterator) for _ in range(6)]
        state = a.state_dict()
    service = AutoReadingService(start=Config("threads", 1, 1), tuner=Scripted({}))
    with pipeloom.DataLoader(make(), service, seed=0, stats=True) as b:
        b.load_state_dict(state)
        rest = list(b)
        stats = b.stats()
    assert head + rest == list(pipeloom.DataLoader(make(), seed=state["seed"]))
    assert len(rest) == 4 and stats.outputs == 4, stats


def children() -> set[int]:
    """This process's child processes (zombies included: a worker not joined is one)."""
    found: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as listed:
            found.update(int(pid) for pid in listed.read().split())
    return found


def retune_and_read(stats: bool):
    """A loader whose tuner placed and retired workers, 7 outputs into its first epoch."""
    plan = {2: Config("processes", 2, 2), 4: Config("threads", 2, 1), 6: Config("processes", 1, 1)}
    service = AutoReadingService(start=Config("threads", 1, 1), tuner=Scripted(plan))
    pipe = IterableWrapper(range(40)).sharding_filter().map(square).batch(4)
    loader = pipeloom.DataLoader(pipe, service, seed=0, stats=stats)
    iterator = iter(loader)
    before = set(children())
    for _ in range(6):
        next(iterator)
    assert children() <= before  # the first processes, retired at output 5: joined
    next(iterator)  # the 1 worker process placed at output 7
    assert len(children() - before) == 1
    return loader, iterator


@pytest.mark.timeout(30)
@pytest.mark.parametrize("stats", [False, True], ids=["plain", "stats"])
def test_workers_the_tuner_retires_exit_and_shutdown_leaves_nothing(stats):
    gc.collect()
    own = OwnResources()  # this process tree's children, threads and fds (memfd segments)
    loader, _ = retune_and_read(stats)
    gc.disable()
    try:
        loader.shutdown()
        left = own.left_after(timeout=5)
    finally:
        gc.enable()
    assert not left, left


@pytest.mark.timeout(30)
@pytest.mark.parametrize("stats", [False, True], ids=["plain", "stats"])
def test_a_retuned_loader_dropped_without_shutdown_stops_by_reference_counting(stats):
    def abandon() -> None:
        loader, iterator = retune_and_read(stats)
        del loader, iterator  # no shutdown(), no gc.collect()

    left, cycles = dropped(abandon, timeout=5)
    assert not left and not cycles, (left, cycles)


def bad_at_13(x):
    if x == 13:
        raise ValueError(f"item {x} is bad")
    return x


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "placed", [Config("processes", 2, 1), Config("threads", 2, 1)], ids=["processes", "threads"]
)
def test_an_error_in_workers_placed_by_a_retune_names_the_block_and_the_item(placed):
    processes = children()
    start = Config("threads", 1, 1) if placed.kind == "processes" else Config("processes", 2, 1)
    service = AutoReadingService(start=start, tuner=Scripted({2: placed}))
    pipe = IterableWrapper(range(40)).sharding_filter().map(bad_at_13).batch(2)
    with pytest.raises(ValueError, match="item 13 is bad") as raised:  # noqa: PT012
        with pipeloom.DataLoader(pipe, service, seed=0) as loader:
            list(loader)
    assert service.replacements == 1 and service.failures == []
    assert "block Mapper(fn=bad_at_13)" in str(raised.value), raised.value
    assert "position 13" in str(raised.value), raised.value
    assert children() == processes


def expand(sample):
    data = sample[1]
    n = int(data.read() if hasattr(data, "read") else data)
    return [(n, k, int(pipeloom.item_rng().integers(100))) for k in range(n % 3)]


def not_one_mod_4(t):
    return t[0] % 4 != 1


@pytest.mark.timeout(60)
def test_a_checkpoint_right_after_a_retune_resumes_under_another_worker_count(tmp_path):
    write_number_shards(tmp_path, [3 + shard for shard in range(4)])

    def make():
        return (
            FileLister(str(tmp_path), "*.tar")
            .shuffle()
            .sharding_filter()
            .open_files("rb")
            .load_from_tar()
            .flatmap(expand)
            .filter(not_one_mod_4)
            .shuffle(buffer_size=5)
            .batch(2)
        )

    untuned = pipeloom.DataLoader(make(), seed=11)
    expected = [list(untuned), list(untuned)]
    service = AutoReadingService(
        start=Config("threads", 1, 1), tuner=Scripted({2: Config("processes", 2, 2)})
    )
    with pipeloom.DataLoader(make(), service, seed=11) as tuned:
        iterator = iter(tuned)
        head = [next(iterator) for _ in range(3)]  # the 3rd came from the new processes
        state = tuned.state_dict()
        assert service.replacements == 1
        assert head + list(iterator) == expected[0]
    with pipeloom.DataLoader(make(), MultiProcessingReadingService(3), seed=0) as resumed:
        resumed.load_state_dict(state)
        assert [head + list(resumed), list(resumed)] == expected


@pytest.mark.timeout(30)
def test_a_saved_choice_beyond_the_budget_is_cut_to_it_and_tuned_again():
    # A checkpoint from a 16-core node resumed on a small one started its 12 worker
    # processes, settled, beyond a budget of 4.
    def make():
        return IterableWrapper(range(40)).sharding_filter().map(square).batch(4)

    with pipeloom.DataLoader(make(), AutoReadingService(start=Config("threads", 1, 1))) as a:
        iterator = iter(a)
        head = [next(iterator)]
        state = a.state_dict()
    state["autotune"] = {"config": Config("processes", 12, 2).to_dict(), "settled": True}
    budget = Budget(
        cpus=2, memory_bytes=2**32, shared_memory_bytes=2**30, max_threads=8, max_processes=4
    )
    service = AutoReadingService(budget=budget, tuner=Scripted({}))
    service.tuner.settled = False
    with pipeloom.DataLoader(make(), service, seed=0) as b:
        b.load_state_dict(state)
        assert head + list(b) == list(pipeloom.DataLoader(make(), seed=state["seed"]))
    assert service.config == Config("processes", 4, 2)
    assert not service.tuner.settled
    assert (
        "beyond this budget" in service.failures[0] and "12 worker processes" in service.failures[0]
    )
    assert Config("threads", 30, 1).fitted_to(budget) == Config("threads", 8, 1)
    assert Config("processes", 3, 2, "economic").fitted_to(budget).processes <= 4
