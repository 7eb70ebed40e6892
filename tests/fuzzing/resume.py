"""One resume example: a random pipeline stopped under one service, resumed under another.

:func:`run_example` draws everything from ``random.Random(seed)``: the
pipeline (:mod:`tests.fuzzing.recipes`), the service A that runs part of an
epoch, how and when its state is taken, and the service B that resumes it.
The ground truth is the same pipeline built afresh and run in-process. The
outcome is ``ok``, ``refused`` (a service declined the combination with a
``StateError``/``ValueError``), ``invalid`` (the ground truth itself
failed), or a failure: ``WRONG`` (items differ), ``error`` (an unexpected
exception where in-process worked) or ``hang`` (the watchdog shut it down).
"""

from __future__ import annotations

import collections
import dataclasses
import pickle
import random
import tempfile
import threading
import warnings
from typing import Any

import torch

from pipeloom import DataLoader
from pipeloom.errors import StateError
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)

from .model import expected_items
from .recipes import ORDER_FREE, build, random_recipe, write_files

FAILURES = ("WRONG", "error", "hang", "LEAK")  # LEAK: the lifecycle fuzzer's
# Options that widen what a seed draws; without them a seed draws what it always drew.
# "ranks": both loaders run one rank's share (``set_outer_sharding``), checked against
# that rank's in-process share, and the shares of all ranks against the whole epoch;
# "slow_starts": worker processes are sometimes started by spawn or forkserver;
# "stamps": recipes.random_recipe(stamps=True), item_rng() after every fan-out;
# "snapshots": each in_memory_cache step is a snapshot(allow_random=True) on disk instead;
# "warm_starts": classic processes are sometimes started by spawn or forkserver with
# warm_start=True (threads of this process make the first outputs).
MODES = ("ranks", "slow_starts", "stamps", "snapshots", "warm_starts")
REFUSALS = (StateError, ValueError)


@dataclasses.dataclass
class Outcome:
    seed: int
    kind: str  # ok, refused, invalid, WRONG, error, hang
    detail: str
    description: str

    @property
    def failed(self) -> bool:
        return self.kind in FAILURES

    def line(self) -> str:
        return f"seed={self.seed} {self.kind}: {self.detail} | {self.description}"


# -- services ---------------------------------------------------------------------------
def random_service(
    rng: random.Random,
    kinds: tuple[str, ...],
    batched: bool,
    unordered: float,
    modes: frozenset[str] = frozenset(),
) -> tuple:
    """A service description (plain data): ``("in_process",)``, ``("threads", ...)``, ...

    ``batched``: the recipe fits economic and chunked, so they are drawn often;
    ``unordered``: the chance of ``in_order=False``; ``modes``: see :data:`MODES`.
    """
    kind = rng.choice(kinds)
    if kind == "in_process":
        return ("in_process",)
    if kind == "threads":
        return ("threads", rng.choice([1, 2, 3]), rng.random() >= unordered, rng.choice([1, 2]))
    strategies = ["classic", "economic", "chunked"] if batched else ["classic"] * 9 + ["chunked"]
    strategy = rng.choice(strategies)
    in_order = strategy != "classic" or rng.random() >= unordered
    persistent = rng.random() < 0.4
    extra = None  # num_batch_workers (economic) or chunk_size (chunked); None: the default
    if strategy != "classic":
        extra = rng.choice([None, None, 0, 1, 2] if strategy == "economic" else [None, None, 1, 2])
    workers, prefetch = rng.choice([1, 2, 3]), rng.choice([1, 2])
    if "warm_starts" in modes and strategy == "classic" and rng.random() < 0.3:
        start = rng.choice(["spawn", "forkserver"])  # threads first, then the processes
        return ("processes", workers, strategy, persistent, in_order, prefetch, extra, start, True)
    if "slow_starts" in modes and rng.random() < 0.15:  # slow: a fresh interpreter per worker
        start = rng.choice(["spawn", "forkserver"])
        return ("processes", workers, strategy, persistent, in_order, prefetch, extra, start)
    return ("processes", workers, strategy, persistent, in_order, prefetch, extra)


def make_service(description: tuple, timeout: float, outer: tuple[int, int] | None = None) -> Any:
    """The service ``description`` names; ``outer``: run only that (ranks, rank) share."""
    service = _make_service(description, timeout)
    if outer is not None:
        service.set_outer_sharding(*outer)
    return service


def _make_service(description: tuple, timeout: float) -> Any:
    kind, *args = description
    if kind == "in_process":
        return InProcessReadingService()
    if kind == "threads":
        workers, in_order, prefetch = args
        return ThreadReadingService(workers, in_order=in_order, prefetch_factor=prefetch)
    workers, strategy, persistent, in_order, prefetch, extra, *start = args
    return MultiProcessingReadingService(
        workers,
        prefetch_factor=prefetch,
        start_method=start[0] if start else "fork",
        warm_start=len(start) > 1 and start[1],
        persistent_workers=persistent,
        timeout=timeout,
        in_order=in_order,
        strategy=strategy,
        num_batch_workers=extra if strategy == "economic" else None,
        chunk_size=extra if strategy == "chunked" else None,
    )


def in_order(description: tuple) -> bool:
    """Whether the service delivers in order."""
    kind = description[0]
    return kind == "in_process" or bool(description[2 if kind == "threads" else 4])


# -- comparing items ----------------------------------------------------------------------
def plain(item: Any) -> Any:
    """A hashable, comparable copy of an item (tensors as nested tuples)."""
    if isinstance(item, torch.Tensor):
        return ("tensor", plain(item.tolist()))
    if isinstance(item, (list, tuple)):
        return tuple(plain(x) for x in item)
    if isinstance(item, dict):
        return tuple(sorted((k, plain(v)) for k, v in item.items()))
    return item


def same(got: list, expected: list, ordered: bool) -> bool:
    if ordered:
        return got == expected
    return collections.Counter(got) == collections.Counter(expected)


def difference(got: list, expected: list) -> str:
    missing = collections.Counter(expected) - collections.Counter(got)
    extra = collections.Counter(got) - collections.Counter(expected)
    first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
    return (
        f"got {len(got)} items, expected {len(expected)}; missing {list(missing.elements())[:5]}"
        f" extra {list(extra.elements())[:5]}; first difference at {first}"
    )


# -- the watchdog -------------------------------------------------------------------------
class Watchdog:
    """Shuts down every loader of the example when it runs past ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.loaders: list[DataLoader] = []
        self.fired = threading.Event()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._timer.cancel()
        for loader in self.loaders:
            loader.shutdown()

    def loader(self, *args: Any, **kwargs: Any) -> DataLoader:
        loader = DataLoader(*args, **kwargs)
        self.loaders.append(loader)
        if self.fired.is_set():
            loader.shutdown()
        return loader

    def _fire(self) -> None:
        self.fired.set()
        for loader in list(self.loaders):
            loader.shutdown()


# -- one example --------------------------------------------------------------------------
@dataclasses.dataclass
class Plan:
    """What one seed draws."""

    recipe: dict[str, Any]
    seed: int
    epoch: int
    service_a: tuple
    service_b: tuple
    replay: bool
    take: str  # "between", "other_thread", "racing_thread", "after_shutdown"
    stop_fraction: float
    go_on: int = 0  # items the loop takes after the state, before it stops (not "racing")
    middle: tuple | None = None  # (service, take, stop_fraction, go_on): a second stop
    outer: tuple[int, int] | None = None  # (ranks, rank): every loader runs that rank's share

    def describe(self) -> str:
        outer = f" outer={self.outer}" if self.outer is not None else ""
        return (
            f"recipe={self.recipe} loader_seed={self.seed} epoch={self.epoch} "
            f"A={self.service_a} B={self.service_b} replay={self.replay} take={self.take} "
            f"stop={self.stop_fraction:.2f} go_on={self.go_on} middle={self.middle}{outer}"
        )


def draw_plan(seed: int, kinds: tuple[str, ...], modes: frozenset[str] = frozenset()) -> Plan:
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown fuzzer modes {sorted(unknown)}; expected some of {MODES}")
    rng = random.Random(seed)
    recipe = random_recipe(rng, stamps="stamps" in modes)
    if "snapshots" in modes:  # (a key the default recipes lack: they print as they did)
        recipe["snapshots"] = True
    free = recipe["order_free"]  # in_order=False changes what order-sensitive blocks make
    batched = recipe["batched"]
    plan = Plan(
        recipe=recipe,
        seed=rng.randrange(1000),
        epoch=rng.choice([0, 0, 1, 3]),
        service_a=random_service(rng, kinds, batched, unordered=0.05 * free, modes=modes),
        service_b=random_service(rng, kinds, batched, unordered=0.4 * free, modes=modes)
        if not recipe["cache_over_random"]
        else ("in_process",),
        replay=rng.random() < 0.2,
        take=rng.choice(["between", "between", "other_thread", "racing_thread", "after_shutdown"]),
        stop_fraction=rng.choice([0.0, 1.0, rng.random(), rng.random()]),
        go_on=rng.choice([0, 0, 1, 3]),
        middle=_middle(rng, kinds, recipe, modes) if rng.random() < 0.3 else None,
    )
    if "ranks" in modes:  # drawn last: the rest of the plan is the default run's
        ranks = rng.choice([2, 2, 3, 4])
        plan.outer = (ranks, rng.randrange(ranks))
    return plan


def _middle(
    rng: random.Random, kinds: tuple[str, ...], recipe: dict[str, Any], modes: frozenset[str]
) -> tuple:
    free = recipe["order_free"]
    service = random_service(rng, kinds, recipe["batched"], unordered=0.05 * free, modes=modes)
    take = rng.choice(["between", "other_thread", "racing_thread", "after_shutdown"])
    return service, take, rng.choice([0.0, 1.0, rng.random()]), rng.choice([0, 1, 3])


def run_example(
    seed: int,
    kinds: tuple[str, ...] = ("in_process", "threads", "processes"),
    watchdog_s: float = 60.0,
    modes: frozenset[str] = frozenset(),
) -> Outcome:
    """Run the example of ``seed``; never raises for what a pipeline or service does."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. a redundant sharding_filter; not what is checked
        return run_plan(draw_plan(seed, kinds, modes), seed, watchdog_s)


def run_plan(plan: Plan, seed: int = -1, watchdog_s: float = 60.0) -> Outcome:
    """Run one drawn (or hand-edited, when minimising) plan."""
    description = plan.describe()
    if not _order_free_enough(plan):
        detail = "in_order=False over order-sensitive blocks after the source's own sharding point"
        return Outcome(seed, "invalid", detail, description)
    with tempfile.TemporaryDirectory(prefix="pipeloom-fuzz-") as root:
        write_files(root, plan.recipe["size"])
        try:
            truth, following = _ground_truth(plan, root, plan.outer)
        except Exception as error:  # noqa: BLE001 - the pipeline itself is not valid
            return Outcome(seed, "invalid", first_line(error), description)
        wrong = _against_the_model(plan.recipe, [truth, *following]) if not plan.outer else ""
        if wrong:
            return Outcome(seed, "WRONG", wrong, description)
        if plan.outer is not None and _shares_partition(plan.recipe):
            wrong = _union_of_shares(plan, root)
            if wrong:
                return Outcome(seed, "WRONG", wrong, description)
        kind, detail = guarded(
            watchdog_s, lambda dog: _stop_and_resume(plan, root, truth, following, dog)
        )
    return Outcome(seed, kind, detail, description)


def guarded(watchdog_s: float, run: Any) -> tuple[str, str]:
    """``run(watchdog)``'s ``(kind, detail)``; a refusal, an error or a hang become one."""
    with Watchdog(watchdog_s) as watchdog:
        try:
            kind, detail = run(watchdog)
        except REFUSALS as error:
            kind, detail = "refused", first_line(error)
        except Exception as error:  # noqa: BLE001 - reported as a failure
            kind, detail = "error", first_line(error)
        if watchdog.fired.is_set():
            kind, detail = "hang", f"the watchdog fired after {watchdog_s} s ({detail})"
    return kind, detail


def first_line(error: BaseException) -> str:
    """The error's type and its message's first line (a fuzzer outcome's detail)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def _ground_truth(plan: Plan, root: str, outer: tuple[int, int] | None) -> tuple[list, list]:
    """The epoch's items in-process (of the share ``outer`` names), and of the next two."""
    service = make_service(("in_process",), timeout=30, outer=outer)
    with DataLoader(build(plan.recipe, root), service, seed=plan.seed) as loader:
        loader.set_epoch(plan.epoch)
        truth = [plain(x) for x in loader]
        following = [[plain(x) for x in loader] for _ in range(2)]
    return truth, following


def _against_the_model(recipe: dict[str, Any], epochs: list[list]) -> str:
    """What is wrong with the in-process epochs against :mod:`.model`, or ''."""
    expected = expected_items(recipe)
    if expected is None:
        return ""
    for number, got in enumerate(epochs):
        if collections.Counter(got) != expected:
            return f"in-process epoch +{number} against the model: " + difference(
                got, list(expected.elements())
            )
    return ""


def _order_free_enough(plan: Plan) -> bool:
    """False when a service delivers out of order into order-sensitive prefix steps.

    The recipe's ``order_free`` looks after the sharding_filter(); a map-style source
    is itself the sharding point, so its prefix steps come after it too.
    """
    hops = (plan.service_a, plan.service_b, *(plan.middle[:1] if plan.middle else ()))
    if all(map(in_order, hops)) or plan.recipe["source"] not in ("sequence", "torch_map"):
        return True
    return all(step[0] in ORDER_FREE for step in plan.recipe["prefix"])


def _shares_partition(recipe: dict[str, Any]) -> bool:
    """Whether the ranks' shares together are the whole epoch's items (in some order).

    So when a sharding point exists and everything after it works on one item at a time;
    but a map-style source is itself the sharding point, and a source joined after it
    (``mux``, ``concat``) is read whole by every rank (docs/distributed.md: warned of).
    """
    sharded = recipe["sharded"] or recipe["source"] in ("tar", "webdataset", "lines")
    joined = any(step[0] in ("mux", "concat_more") for step in recipe["prefix"])
    shards_at_source = recipe["source"] in ("sequence", "torch_map")
    return sharded and recipe["order_free"] and not (joined and shards_at_source)


def _union_of_shares(plan: Plan, root: str) -> str:
    """What is wrong with the in-process shares of all ranks against the whole epoch, or ''."""
    assert plan.outer is not None
    whole = _ground_truth(plan, root, None)
    shares = [_ground_truth(plan, root, (plan.outer[0], rank)) for rank in range(plan.outer[0])]
    for number in range(3):  # the epoch and the next two
        union = [x for share in shares for x in (share[0], *share[1])[number]]
        expected = (whole[0], *whole[1])[number]
        if not same(union, expected, ordered=False):
            return f"epoch +{number}: the ranks' shares: " + difference(union, expected)
    return ""


def _stop_and_resume(
    plan: Plan, root: str, truth: list, following: list[list], watchdog: Watchdog
) -> tuple[str, str]:
    hops = [(plan.service_a, plan.take, plan.stop_fraction, plan.go_on)]
    if plan.middle is not None:  # resumed, stopped and saved once more
        hops.append(plan.middle)
    ordered = all(in_order(hop[0]) for hop in hops) and in_order(plan.service_b)
    delivered: list = []  # the epoch's items delivered before the last state
    state: dict | None = None
    for number, (service, take, fraction, go_on) in enumerate(hops):
        loader = watchdog.loader(
            build(plan.recipe, root),
            make_service(service, timeout=30, outer=plan.outer),
            seed=plan.seed + number,
            resume_by_replay=plan.replay,
        )
        if state is None:
            loader.set_epoch(plan.epoch)
        else:
            loader.load_state_dict(state)
        stop = round(fraction * (len(truth) - len(delivered)))
        iterator, got, state = _run_and_take(loader, take, stop)
        saved = pickle.dumps(state)  # as a checkpoint is written at once
        for _ in range(go_on if take != "after_shutdown" else 0):
            if next(iterator, None) is None:  # (the fuzzer's items are never None)
                break
        loader.shutdown()
        if pickle.dumps(state) != saved:
            return "WRONG", f"hop {number}: the state changed after state_dict() returned"
        state = pickle.loads(saved)
        delivered += got
        if state["epoch"] != plan.epoch:
            break
        delivered = delivered[: state["delivered"]]
    assert state is not None
    resumed = watchdog.loader(
        build(plan.recipe, root),
        make_service(plan.service_b, timeout=30, outer=plan.outer),
        seed=plan.seed + 7,
    )
    resumed.load_state_dict(state)
    if state["epoch"] == plan.epoch:
        rest = [plain(x) for x in resumed]
        if not same(delivered + rest, truth, ordered):
            return "WRONG", "epoch: " + difference(delivered + rest, truth)
    elif state["epoch"] != plan.epoch + 1 or not same(delivered, truth, ordered):
        return "WRONG", (
            f"the state names epoch {state['epoch']} (delivered {state['delivered']}) after "
            f"{len(delivered)} of the {len(truth)} items of epoch {plan.epoch}"
        )
    for number, expected in enumerate(following, 1):  # (persistent workers go on)
        got = [plain(x) for x in resumed]
        if not same(got, expected, in_order(plan.service_b)):
            return "WRONG", f"epoch +{number}: " + difference(got, expected)
    return "ok", f"stopped after {len(delivered)} of {len(truth)}"


def _run_and_take(loader: DataLoader, take: str, stop: int) -> tuple[Any, list, dict]:
    """Deliver items and take a state as ``take`` says: (the epoch, items delivered, state)."""
    iterator = iter(loader)
    before: list = []
    while len(before) < stop:
        try:
            before.append(plain(next(iterator)))
        except StopIteration:
            break
    if take == "between":
        return iterator, before, loader.state_dict()
    if take == "after_shutdown":
        loader.shutdown()
        return iterator, before, loader.state_dict()
    taken: list = []
    thread = threading.Thread(target=lambda: taken.append(_state_or_error(loader)))
    if take == "other_thread":
        thread.start()
        thread.join()
    else:  # racing: the state is taken while this thread goes on iterating
        thread.start()
        for _ in range(3):
            try:
                before.append(plain(next(iterator)))
            except StopIteration:
                break
        thread.join()
    if isinstance(taken[0], BaseException):
        raise taken[0]
    return iterator, before, taken[0]


def _state_or_error(loader: DataLoader) -> Any:
    try:
        return loader.state_dict()
    except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
        return error
