"""One elastic resume example: an epoch stopped on some ranks, resumed on another number.

The ranks are threads of this process (``tests/reading_service/thread_ranks.py``:
the real ``DistributedReadingService``, its collectives exchanged between
threads). :func:`run_elastic_example` draws from ``random.Random(seed)`` a
recipe whose blocks after the sharding point work on one item at a time (so
the ranks' items together are the epoch's), ``old`` ranks that each deliver
``step`` items and save, the states joined with ``merge_rank_states``, and
``new`` ranks that load the joined state. Checked (docs/distributed.md):
no item more often than in the whole epoch, with ``uneven="shortest"`` few
items dropped (at most a group per rank) and with ``"pad"`` none; and the
next epoch on the new ranks is a fresh ``new``-rank job's.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import tempfile
import warnings
from typing import Any

from pipeloom import DataLoader
from pipeloom.errors import StateError
from pipeloom.reading_service import merge_rank_states
from tests.reading_service.thread_ranks import rank_service, run_ranks

from .recipes import build, random_recipe, write_files
from .resume import (
    REFUSALS,
    Outcome,
    _shares_partition,
    first_line,
    make_service,
    plain,
    random_service,
)

KINDS = ("in_process", "threads", "processes")


@dataclasses.dataclass
class ElasticPlan:
    recipe: dict[str, Any]
    seed: int
    epoch: int
    old: int  # ranks that stop and save
    new: int  # ranks that resume the joined state
    inner_old: tuple  # each rank's inner service (a resume.random_service description)
    inner_new: tuple
    uneven: str
    step: int  # items each old rank delivers before its state

    def describe(self) -> str:
        return (
            f"elastic recipe={self.recipe} loader_seed={self.seed} epoch={self.epoch} "
            f"old={self.old} x {self.inner_old} new={self.new} x {self.inner_new} "
            f"uneven={self.uneven} step={self.step}"
        )


def draw_elastic_plan(seed: int) -> ElasticPlan:
    rng = random.Random(seed)
    recipe = random_recipe(rng)
    for _ in range(100):  # the ranks' items together are the epoch's only for these
        if _shares_partition(recipe) and not recipe["batched"]:
            break
        recipe = random_recipe(rng)
    return ElasticPlan(
        recipe=recipe,
        seed=rng.randrange(1000),
        epoch=rng.choice([0, 0, 1]),
        old=rng.choice([1, 2, 2, 3]),
        new=rng.choice([1, 2, 3, 3]),
        inner_old=random_service(rng, KINDS, False, unordered=0.0),
        inner_new=random_service(rng, KINDS, False, unordered=0.0),
        uneven=rng.choice(["shortest", "pad"]),
        step=rng.choice([0, 1, 2, 5, 9]),
    )


def run_elastic_example(seed: int, timeout_s: float = 30.0) -> Outcome:
    """Run the elastic example of ``seed``; never raises for what a pipeline or service does."""
    plan = draw_elastic_plan(seed)
    with warnings.catch_warnings(), tempfile.TemporaryDirectory(prefix="pipeloom-fuzz-") as root:
        warnings.simplefilter("ignore")  # e.g. a source read whole by every rank
        write_files(root, plan.recipe["size"])
        try:
            whole = _whole_epoch(plan, root)
        except Exception as error:  # noqa: BLE001 - the pipeline itself is not valid
            return Outcome(seed, "invalid", first_line(error), plan.describe())
        try:
            kind, detail = _stop_and_resume(plan, root, whole, timeout_s)
        except REFUSALS as error:
            kind, detail = "refused", first_line(error)
        except AssertionError as error:  # run_ranks: a rank still running (a hang)
            kind, detail = "hang", first_line(error)
        except Exception as error:  # noqa: BLE001 - reported as a failure
            kind, detail = "error", first_line(error)
    return Outcome(seed, kind, detail, plan.describe())


def _whole_epoch(plan: ElasticPlan, root: str) -> list:
    with DataLoader(build(plan.recipe, root), seed=plan.seed) as loader:
        loader.set_epoch(plan.epoch)
        return [plain(x) for x in loader]


def _ranks(size: int, body: Any, timeout_s: float) -> list:
    """Each rank's result; the first rank's error raised again (a refusal stays one)."""
    results = run_ranks(size, body, timeout=timeout_s)
    errors = [result for result in results if result[0] == "error"]
    for result in errors:  # a rank that refused (the others then raise DistributedError)
        if result[1] in ("StateError", "ValueError", "PlanError"):  # (PlanError: ValueError)
            raise StateError(f"{result[1]}: {result[2]}")
    for result in errors:
        raise RuntimeError(f"{result[1]}: {result[2]}")
    return [result[1] for result in results]


def _loader(plan: ElasticPlan, root: str, world: Any, rank: int, inner: tuple) -> DataLoader:
    service = rank_service(
        world, rank, plan.uneven, inner=lambda: make_service(inner, timeout=plan.step + 20)
    )
    return DataLoader(build(plan.recipe, root), service, seed=plan.seed)


def _drop_bound(plan: ElasticPlan) -> int | None:
    """How many items ``uneven="shortest"`` may drop: a position's outputs per rank, old and
    new (docs/distributed.md: an even split), and per new rank one held unit (an item, at
    most a position's outputs) of each block that may hold some after the sharding point
    (``prefetch``, ``threadpool_map``: shared out over the new ranks); None where the split
    is not even (a filter, or positions that are files of many samples)."""
    steps = [step[0] for step in (*plan.recipe["prefix"], *plan.recipe["per_item"])]
    steps += [step[0] for step in plan.recipe["tail"]]
    if "keep" in steps or plan.recipe["source"] in ("tar", "webdataset", "lines"):
        return None
    outputs = 2 ** sum(name in ("pairs", "rng_pairs") for name in steps)
    after = [step[0] for step in (*plan.recipe["per_item"], *plan.recipe["tail"])]
    holding = sum(name in ("prefetch", "threadpool_map") for name in after)
    return outputs * (plan.old + plan.new + holding * plan.new)


def _stop_and_resume(
    plan: ElasticPlan, root: str, whole: list, timeout_s: float
) -> tuple[str, str]:
    def stop(world: Any, rank: int) -> tuple[list, dict]:
        with _loader(plan, root, world, rank, plan.inner_old) as loader:
            loader.set_epoch(plan.epoch)
            epoch = iter(loader)
            head = [plain(x) for _, x in zip(range(plan.step), epoch)]
            return head, loader.state_dict()

    def resume(world: Any, rank: int) -> tuple[list, list]:
        with _loader(plan, root, world, rank, plan.inner_new) as loader:
            loader.load_state_dict(joined)
            rest = [plain(x) for x in loader] if joined["epoch"] == plan.epoch else []
            return rest, [plain(x) for x in loader]  # (saved after the epoch: no rest)

    def fresh(world: Any, rank: int) -> list:
        with _loader(plan, root, world, rank, ("in_process",)) as loader:
            loader.set_epoch(plan.epoch + 1)
            return [plain(x) for x in loader]

    stopped = _ranks(plan.old, stop, timeout_s)
    joined = merge_rank_states([state for _, state in stopped])
    resumed = _ranks(plan.new, resume, timeout_s)
    got = collections.Counter(x for head, _ in stopped for x in head)
    got.update(x for rest, _ in resumed for x in rest)
    expected = collections.Counter(whole)
    extra, missing = got - expected, expected - got
    if plan.uneven == "shortest" and extra:
        return "WRONG", f"items more often than in the whole epoch: {list(extra.elements())[:5]}"
    if plan.uneven == "pad" and missing:
        return "WRONG", f"items no rank delivered: {list(missing.elements())[:5]}"
    if plan.uneven == "pad" and set(extra) - set(expected):
        return "WRONG", f"items not of the epoch: {sorted(set(extra) - set(expected))[:5]}"
    bound = _drop_bound(plan)
    if bound is not None and sum(missing.values()) > bound:
        return "WRONG", f"{sum(missing.values())} items dropped (more than {bound})"
    following = _ranks(plan.new, fresh, timeout_s)
    for rank, ((_, next_epoch), expected_next) in enumerate(zip(resumed, following)):
        if next_epoch != expected_next:
            return "WRONG", (
                f"rank {rank}'s next epoch: got {next_epoch[:6]}..., a fresh {plan.new}-rank "
                f"job's is {expected_next[:6]}..."
            )
    return "ok", f"{sum(got.values())} of {len(whole)} items delivered ({plan.uneven})"
