"""The lifecycle fuzzer (``scripts/fuzz_resume.py --loader lifecycle``) on a few fixed seeds.

Each seed runs a random sequence of loader operations on a service and, in
lockstep, in-process; every result must agree and no worker process may outlive
its loader. Run the script itself for thousands of examples.
"""

from __future__ import annotations

import pytest

from tests.fuzzing.lifecycle import KINDS, OPS, Plan, draw_plan, run_lifecycle_example, run_plan

pytestmark = pytest.mark.timeout(120)

SEEDS = tuple(range(30))  # about 5 s
# plans that once found a bug, minimised: an in-process item took the draws of an item of
# another loader in this thread (seed 560)
REGRESSIONS = [
    Plan(
        recipe={
            "source": "torch_map",
            "size": 0,
            "prefix": [("shuffle", 1000), ("concat_more", 2)],
            "sharded": True,
            "per_item": [("jitter",)],
            "tail": [("keep",)],
            "batched": False,
            "order_free": True,
            "cache_over_random": False,
        },
        seed=779,
        service=("in_process",),
        stats=False,
        replay=False,
        ops=[("next", 2), ("drop", ("in_process",), None), ("next", 1)],
    )
]


def test_the_seeds_cover_every_service_and_operation():
    plans = [draw_plan(seed) for seed in SEEDS]
    assert {plan.service[0] for plan in plans} == {"in_process", "threads", "processes", "auto"}
    assert {op[0] for plan in plans for op in plan.ops} == set(OPS)
    assert set(KINDS) == {"in_process", "threads", "processes", "auto"}


@pytest.mark.parametrize("seed", SEEDS)
def test_a_sequence_of_operations_agrees_with_in_process(seed):
    outcome = run_lifecycle_example(seed, watchdog_s=60)
    assert not outcome.failed, outcome.line()
    assert outcome.kind in ("ok", "refused")


@pytest.mark.parametrize("plan", REGRESSIONS)
def test_a_plan_that_once_failed_agrees_with_in_process(plan):
    outcome = run_plan(plan, watchdog_s=60)
    assert outcome.kind == "ok", outcome.line()
