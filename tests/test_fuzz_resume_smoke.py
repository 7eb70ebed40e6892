"""The resume fuzzer (scripts/fuzz_resume.py) on a few fixed seeds: no wrong data, no hang.

The seeds cover in-process, thread and process services as A (stopped) and B
(resumed); run the script itself for thousands of examples.
"""

from __future__ import annotations

import pytest

from tests.fuzzing.resume import draw_plan, run_example

pytestmark = pytest.mark.timeout(120)

KINDS = ("in_process", "threads", "processes")
SEEDS = tuple(range(40))  # about 15 s
# seeds that once found wrong data: in_memory_cache over concat/mux replayed one seed
REGRESSIONS = (11703, 60808)


def test_the_seeds_cover_every_kind_of_service():
    drawn = {plan.service_a[0] for plan in map(lambda s: draw_plan(s, KINDS), SEEDS)}
    drawn |= {plan.service_b[0] for plan in map(lambda s: draw_plan(s, KINDS), SEEDS)}
    assert drawn == set(KINDS)


@pytest.mark.parametrize("seed", SEEDS + REGRESSIONS)
def test_a_resumed_example_gives_the_uninterrupted_items(seed):
    outcome = run_example(seed, KINDS, watchdog_s=60)
    assert not outcome.failed, outcome.line()
    assert outcome.kind in ("ok", "refused", "invalid")
