"""HillClimb's decisions, on simulated pipelines (a fake clock and CPU meter)."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipeloom.autotune import Budget, Config, HillClimb
from pipeloom.reading_service.services import processes

BUDGET = Budget(
    cpus=2, memory_bytes=2**40, shared_memory_bytes=2**40, max_threads=16, max_processes=4
)


class Simulated:
    """A pipeline whose throughput and CPU use under each configuration are known."""

    def __init__(self, per_item_s, cpu_share, gil, cpus=2):
        self.per_item_s = per_item_s  # seconds of work per output
        self.cpu_share = cpu_share  # share of it that computes (the rest waits)
        self.gil = gil  # computing holds the GIL
        self.cpus = cpus
        self.now = 0.0
        self.cpu_s = 0.0

    def rate_and_cores(self, config):
        parallel = config.workers
        compute = self.cpu_share * parallel
        limit = 1 if (self.gil and config.kind == "threads") else self.cpus
        if compute > limit:  # the computing part saturates the cores (or the GIL)
            parallel *= limit / compute
        rate = parallel / self.per_item_s
        if config.kind == "processes":
            rate *= 0.95  # the copy between processes
        cores = rate * self.per_item_s * self.cpu_share
        return rate, cores

    def deliver(self, tuner, config):
        """One output of ``config``: the clock and CPU move on; the tuner's decision."""
        rate, cores = self.rate_and_cores(config)
        self.now += 1 / rate
        self.cpu_s += cores / rate
        return tuner.observe(self.now, 1 / rate, 1000)

    def run(self, tuner, start, outputs=5000):
        config = start
        tuner.start(config)
        proposed = [config]
        for _ in range(outputs):
            decision = self.deliver(tuner, config)
            if decision is not None:
                config = decision
                proposed.append(config)
                tuner.start(config)
            if tuner.settled:
                break
        return config, proposed


def climb(model, budget=BUDGET):
    return HillClimb(budget, clock=lambda: model.now, cpu=lambda: model.cpu_s)


def best_rate(model, budget=BUDGET):
    configs = [Config("threads", w, p) for w in range(1, budget.max_threads + 1) for p in (1, 2)]
    configs += [
        Config("processes", w, p) for w in range(1, budget.max_processes + 1) for p in (1, 2)
    ]
    return max(
        rate
        for config in configs
        for rate, cores in [model.rate_and_cores(config)]
        if cores <= budget.cpus * 1.05
    )


def test_gil_bound_work_moves_to_processes():
    model = Simulated(per_item_s=0.002, cpu_share=1.0, gil=True)
    chosen, _ = model.run(climb(model), Config("threads", 1, 1))
    assert chosen.kind == "processes" and chosen.workers == 2
    assert model.rate_and_cores(chosen)[0] >= 0.9 * best_rate(model)


def test_waiting_work_grows_threads_to_the_budget():
    model = Simulated(per_item_s=0.01, cpu_share=0.02, gil=True)
    tuner = climb(model)
    chosen, _ = model.run(tuner, Config("processes", 1, 1))
    assert chosen == Config("threads", 16, chosen.prefetch)
    assert tuner.settled
    assert [t.verdict for t in tuner.trials].count("best") >= 4


def test_a_consumer_bound_loop_is_left_alone():
    tuner = HillClimb(BUDGET, clock=lambda: 0.0, cpu=lambda: 0.0, window_s=0.0, warmup=0)
    tuner.start(Config("threads", 1, 1))
    decisions = [tuner.observe(0.1 * i, 0.0001, 10) for i in range(50)]
    assert decisions == [None] * 50
    assert tuner.trials and all(t.verdict == "consumer-bound" for t in tuner.trials)
    assert not tuner.settled  # it would climb if the loader became the bottleneck


def test_shared_memory_budget_limits_process_prefetch():
    model = Simulated(per_item_s=0.002, cpu_share=1.0, gil=True)
    budget = Budget(2, 2**40, shared_memory_bytes=2 * 2 * 1000, max_threads=4, max_processes=4)
    _, proposed = model.run(climb(model, budget), Config("threads", 1, 1))
    for config in proposed[1:]:
        if config.kind == "processes":
            assert config.workers * config.prefetch * 1000 <= budget.shared_memory_bytes


@settings(max_examples=30, deadline=None)
@given(
    per_item_ms=st.floats(2, 20),
    cpu_share=st.floats(0.01, 1.0),
    gil=st.booleans(),
    cpus=st.integers(1, 4),
    max_processes=st.integers(1, 8),
    more_threads=st.integers(0, 24),
    start=st.builds(Config, st.sampled_from(["threads", "processes"]), st.just(1), st.just(1)),
)
@example(  # a measured 0.700000000000008 cores per thread put 6 threads over 4.2 cores
    per_item_ms=2.0,
    cpu_share=0.7,
    gil=False,
    cpus=4,
    max_processes=1,
    more_threads=5,
    start=Config("threads", 1, 1),
)
def test_never_exceeds_the_budget_and_reaches_most_of_the_best(
    per_item_ms, cpu_share, gil, cpus, max_processes, more_threads, start
):
    max_threads = max_processes + more_threads  # threads cost less than processes
    budget = Budget(cpus, 2**40, 2**40, max_threads, max_processes)
    model = Simulated(per_item_ms / 1000, cpu_share, gil, cpus)
    tuner = climb(model, budget)
    chosen, proposed = model.run(tuner, start, outputs=30000)
    assert tuner.settled
    for config in proposed[1:]:
        limit = max_threads if config.kind == "threads" else max_processes
        assert config.workers <= limit
        assert model.rate_and_cores(config)[1] <= cpus * 1.05 + 1e-9
    assert model.rate_and_cores(chosen)[0] >= 0.5 * best_rate(model, budget)


def test_a_memory_budget_too_small_for_a_process_keeps_to_threads():
    model = Simulated(per_item_s=0.002, cpu_share=1.0, gil=True)
    budget = Budget(2, memory_bytes=1, shared_memory_bytes=2**40, max_threads=4, max_processes=4)
    tuner = climb(model, budget)
    chosen, proposed = model.run(tuner, Config("threads", 1, 1))
    assert tuner.settled
    assert all(config.kind == "threads" for config in proposed)
    assert chosen.kind == "threads"


def test_the_climb_drops_a_kind_of_worker_that_failed_to_start():
    model = Simulated(per_item_s=0.002, cpu_share=1.0, gil=True)
    tuner = HillClimb(BUDGET, clock=lambda: model.now, cpu=lambda: model.cpu_s)
    tuner.rejected(Config("processes", 2, 1), "RuntimeError: no")
    _, proposed = model.run(tuner, Config("threads", 1, 1))
    assert tuner.settled and all(config.kind == "threads" for config in proposed)
    assert tuner.trials[0].verdict == "failed to start: RuntimeError: no"


def keep_running(model, tuner, config, outputs):
    """Deliver ``outputs`` more outputs of ``config``; the decisions the tuner made."""
    decisions = []
    for _ in range(outputs):
        decision = model.deliver(tuner, config)
        if decision is not None:
            decisions.append(decision)
            config = decision
            tuner.start(config)
    return decisions


def test_a_settled_climb_tunes_again_when_the_rate_drops():
    model = Simulated(per_item_s=0.01, cpu_share=0.02, gil=True)  # waits: threads grow
    tuner = climb(model)
    chosen, _ = model.run(tuner, Config("threads", 2, 1))
    assert tuner.settled
    assert keep_running(model, tuner, chosen, 400) == []  # steady: nothing moves
    model.per_item_s *= 3  # the data got heavier: a third of the rate
    decisions = keep_running(model, tuner, chosen, 2000)
    assert "dropped: tuning again" in [t.verdict for t in tuner.trials]
    assert decisions, "it should have tried a neighbour after the drop"
    for config in decisions:  # still within the budget
        assert config.workers <= (16 if config.kind == "threads" else 4)


def test_a_drop_the_consumer_causes_does_not_tune_again():
    model = Simulated(per_item_s=0.01, cpu_share=0.02, gil=True)
    tuner = climb(model)
    chosen, _ = model.run(tuner, Config("threads", 2, 1))
    assert tuner.settled
    for _ in range(400):  # half the rate, but the consumer never waits: its own step is slow
        model.now += 2 / model.rate_and_cores(chosen)[0]
        assert tuner.observe(model.now, 0.0, 1000) is None
    assert "dropped: tuning again" not in [t.verdict for t in tuner.trials]


def test_a_resumed_tuned_job_watches_from_its_first_window():
    model = Simulated(per_item_s=0.01, cpu_share=0.02, gil=True)
    tuner = climb(model)
    tuner.resume(Config("threads", 16, 2))
    assert keep_running(model, tuner, Config("threads", 16, 2), 300) == []  # the baseline
    model.per_item_s *= 4
    keep_running(model, tuner, Config("threads", 16, 2), 1000)
    assert "dropped: tuning again" in [t.verdict for t in tuner.trials]


class WithStrategies(Simulated):
    """``faster``: a factor on the rate of configurations of that strategy."""

    def __init__(self, *args, faster, **kwargs):
        super().__init__(*args, **kwargs)
        self.faster = faster

    def rate_and_cores(self, config):
        rate, cores = super().rate_and_cores(config)
        factor = self.faster.get(config.strategy, 1.0)
        return rate * factor, cores


def test_classic_processes_try_the_other_strategies_and_keep_the_faster():
    model = WithStrategies(per_item_s=0.002, cpu_share=1.0, gil=True, faster={"chunked": 1.4})
    tuner = climb(model)
    chosen, proposed = model.run(tuner, Config("processes", 2, 2))
    assert chosen.strategy == "chunked", proposed
    model = WithStrategies(per_item_s=0.002, cpu_share=1.0, gil=True, faster={"economic": 1.4})
    tuner = climb(model)
    chosen, proposed = model.run(tuner, Config("processes", 2, 2))
    assert chosen.strategy == "economic", proposed
    assert any(c.strategy == "chunked" for c in proposed)  # tried first, no faster


def test_a_strategy_that_cannot_start_rules_out_only_itself():
    tuner = climb(Simulated(per_item_s=0.002, cpu_share=1.0, gil=True))
    tuner.start(Config("processes", 2, 2))
    tuner.rejected(Config("processes", 2, 2, "economic"), "ValueError: not one to one")
    assert not tuner.within_budget(Config("processes", 2, 2, "economic"), 0.1)
    assert tuner.within_budget(Config("processes", 2, 2, "chunked"), 0.1)
    assert tuner.within_budget(Config("processes", 3, 2), 0.1)
    tuner.rejected(Config("processes", 2, 2, "chunked", 4), "ValueError: chunk too big")
    assert tuner.within_budget(Config("processes", 2, 2, "chunked", 2), 0.1)


def test_a_deferred_move_pauses_the_measurements_until_it_starts():
    model = Simulated(per_item_s=0.002, cpu_share=1.0, gil=True)
    tuner = climb(model)
    tuner.start(Config("processes", 2, 2))
    tuner.deferred(Config("processes", 2, 2, "chunked"))
    assert all(tuner.observe(0.01 * i, 0.01, 100) is None for i in range(200))
    assert tuner.trials == []
    tuner.start(Config("processes", 2, 2, "chunked", 8))
    assert Config("processes", 2, 2, "chunked") in tuner._tried  # its default size, resolved


def test_economic_and_chunked_count_their_shared_memory_flat_in_workers(monkeypatch):
    monkeypatch.setattr(processes, "_usable_cores", lambda: 16)  # economic: batch workers
    budget = Budget(2, 2**40, shared_memory_bytes=3 * 1000, max_threads=4, max_processes=8)
    tuner = climb(Simulated(per_item_s=0.002, cpu_share=1.0, gil=True), budget)
    tuner.start(Config("processes", 1, 2))
    tuner.observe(0.0, 0.0, 1000)  # the largest output: 1000 bytes
    assert not tuner.within_budget(Config("processes", 2, 2), 0.1)  # 4 outputs in flight
    assert tuner.within_budget(Config("processes", 2, 2, "chunked"), 0.1)  # 3
    assert not tuner.within_budget(Config("processes", 7, 2, "economic"), 0.1)  # 9 processes
    monkeypatch.setattr(processes, "_usable_cores", lambda: 2)  # economic: no batch workers
    assert Config("processes", 7, 2, "economic").processes == 7
    assert tuner.within_budget(Config("processes", 7, 2, "economic"), 0.1)


def test_before_a_strategy_move_waits_for_an_epoch_the_climb_returns_to_its_best():
    model = Simulated(per_item_s=0.002, cpu_share=1.0, gil=True)
    tuner = climb(model)
    tuner.start(Config("processes", 2, 1))
    proposed = []
    config = Config("processes", 2, 1)
    for _ in range(3000):
        rate, cores = model.rate_and_cores(config)
        if config.prefetch > 1:
            rate *= 0.8  # deeper prefetch is slower here
        model.now += 1 / rate
        model.cpu_s += cores / rate
        decision = tuner.observe(model.now, 1 / rate, 1000)
        if decision is None:
            continue
        proposed.append(decision)
        if not decision.moves_within_epoch(config):
            break  # the service would defer it: it must come while the best runs
        config = decision
        tuner.start(config)
    assert proposed[-1].strategy != "classic", proposed
    assert config == Config("processes", 2, 1), proposed  # not the slower prefetch 2
