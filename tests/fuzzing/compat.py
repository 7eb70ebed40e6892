"""One resume example of the torch drop-in, ``pipeloom.compat.DataLoader``.

:func:`run_compat_example` draws from ``random.Random(seed)`` a map-style torch
dataset, torch's loader arguments for a loader A (batch size, shuffle with a
seeded generator, 0/1/2 workers, strategy, ...) and a loader B that resumes
A's state; A runs some whole epochs, part of one, gives its state (between
batches, after a ``break`` or after ``shutdown()``), and B, built afresh,
loads it. The ground truth is a loader built as A and run without a stop.
Outcomes as in :mod:`tests.fuzzing.resume`.
"""

from __future__ import annotations

import dataclasses
import io
import random
import tempfile
import warnings
from typing import Any

import torch

from pipeloom.compat import DataLoader
from pipeloom.datapipes import item_rng

from .recipes import TorchMap
from .resume import Outcome, Watchdog, difference, guarded, plain, same

DATASETS = ("torch_map", "jitter_map", "list")


class JitterMap(TorchMap):
    """A map-style torch dataset drawing from item_rng(): item i is 3 * i * 1000 + a draw."""

    def __getitem__(self, index):
        return super().__getitem__(index) * 1000 + int(item_rng().integers(1000))


@dataclasses.dataclass
class CompatPlan:
    """What one seed draws."""

    dataset: str
    size: int
    generator_seed: int
    loader_a: dict[str, Any]
    loader_b: dict[str, Any]
    whole_epochs: int  # epochs A (and the ground truth) run before the stopped one
    take: str  # "between", "after_break", "after_shutdown"
    stop_fraction: float

    def describe(self) -> str:
        return (
            f"dataset={self.dataset} size={self.size} generator={self.generator_seed} "
            f"A={self.loader_a} B={self.loader_b} whole_epochs={self.whole_epochs} "
            f"take={self.take} stop={self.stop_fraction:.2f}"
        )


def _workers(rng: random.Random, base: dict[str, Any], workers: int) -> dict[str, Any]:
    """The worker arguments for ``workers`` workers (none at 0)."""
    if workers == 0:
        return {**base, "num_workers": 0}
    worker_type = rng.choice(["process", "process", "thread"])
    strategy = rng.choice(["classic", "classic", "economic", "chunked"])
    if base["batch_size"] is None:  # the sampler fixes the batches: only classic
        strategy = "classic"
    args = {**base, "num_workers": workers, "worker_type": worker_type}
    if worker_type == "process":
        args.update(
            strategy=strategy,
            persistent_workers=rng.random() < 0.4,
            prefetch_factor=rng.choice([1, 2]),
            timeout=30,
            multiprocessing_context="fork",
        )
        if strategy != "classic":
            return args
    args["in_order"] = rng.random() >= 0.2
    return args


def draw_compat_plan(seed: int) -> CompatPlan:
    rng = random.Random(seed)
    dataset = rng.choice(DATASETS)
    size = rng.choice([0, 1, 2, 5, 8, 13, 31])
    base = {
        "batch_size": rng.choice([None, 1, 2, 3, 5]),
        "shuffle": size > 0 and rng.random() < 0.6,  # (torch refuses to shuffle nothing)
    }
    if base["batch_size"] is not None:
        base["drop_last"] = rng.random() < 0.3
    loader_a = _workers(rng, base, rng.choice([0, 1, 2]))
    if dataset == "jitter_map":  # item_rng() draws depend on the strategy and persistence
        loader_b = dict(loader_a)
        if loader_a["num_workers"]:
            loader_b["num_workers"] = rng.choice([1, 2])
    else:
        loader_b = _workers(rng, base, rng.choice([0, 1, 2]))
    return CompatPlan(
        dataset=dataset,
        size=size,
        generator_seed=rng.randrange(1000),
        loader_a=loader_a,
        loader_b=loader_b,
        whole_epochs=rng.choice([0, 0, 1]),
        take=rng.choice(["between", "between", "after_break", "after_shutdown"]),
        stop_fraction=rng.choice([0.0, 1.0, rng.random(), rng.random()]),
    )


def _dataset(name: str, size: int) -> Any:
    if name == "torch_map":
        return TorchMap(size)
    if name == "jitter_map":
        return JitterMap(size)
    return [5 * i for i in range(size)]


def run_compat_example(seed: int, watchdog_s: float = 60.0) -> Outcome:
    """Run the compat example of ``seed``; never raises for what a loader does."""
    plan = draw_compat_plan(seed)
    with warnings.catch_warnings(), tempfile.TemporaryDirectory(prefix="pipeloom-fuzz-"):
        warnings.simplefilter("ignore")
        kind, detail = guarded(watchdog_s, lambda watchdog: _stop_and_resume(plan, watchdog))
    return Outcome(seed, kind, detail, "compat " + plan.describe())


def _loader(plan: CompatPlan, args: dict[str, Any], watchdog: Watchdog) -> DataLoader:
    generator = torch.Generator().manual_seed(plan.generator_seed)
    loader = DataLoader(_dataset(plan.dataset, plan.size), generator=generator, **args)
    watchdog.loaders.append(loader)  # type: ignore[arg-type] - shut down alike
    return loader


def _persists(args: dict[str, Any]) -> bool:
    """Whether the loader keeps its workers: its later epochs draw no base seed (as torch's)."""
    return bool(args.get("persistent_workers")) and args["num_workers"] > 0


def _stop_and_resume(plan: CompatPlan, watchdog: Watchdog) -> tuple[str, str]:
    reference = _loader(plan, plan.loader_a, watchdog)
    epochs = [[plain(x) for x in reference] for _ in range(plan.whole_epochs + 2)]
    reference.shutdown()
    truth, following = epochs[-2], epochs[-1]
    ordered = all(args.get("in_order", True) for args in (plan.loader_a, plan.loader_b))

    stopped = _loader(plan, plan.loader_a, watchdog)
    for number in range(plan.whole_epochs):
        got = [plain(x) for x in stopped]
        if not same(got, epochs[number], plan.loader_a.get("in_order", True)):
            return "WRONG", f"whole epoch {number} of A: " + difference(got, epochs[number])
    iterator = iter(stopped)
    delivered = [plain(x) for _, x in zip(range(round(plan.stop_fraction * len(truth))), iterator)]
    if plan.take == "after_break":
        del iterator
    elif plan.take == "after_shutdown":
        stopped.shutdown()
    buffer = io.BytesIO()
    torch.save(stopped.state_dict(), buffer)  # as a checkpoint is written
    stopped.shutdown()
    buffer.seek(0)

    resumed = _loader(plan, plan.loader_b, watchdog)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    rest = [plain(x) for x in resumed]
    if not same(delivered + rest, truth, ordered):
        return "WRONG", "epoch: " + difference(delivered + rest, truth)
    if _persists(plan.loader_a) != _persists(plan.loader_b):
        return "ok", f"stopped after {len(delivered)} of {len(truth)} (next epoch not compared)"
    got = [plain(x) for x in resumed]
    if not same(got, following, ordered):  # (the reference ran as A)
        return "WRONG", "epoch +1: " + difference(got, following)
    return "ok", f"stopped after {len(delivered)} of {len(truth)}"
