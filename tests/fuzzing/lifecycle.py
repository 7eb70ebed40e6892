"""One lifecycle example: a random sequence of loader operations, on a service and in-process.

:func:`run_lifecycle_example` draws from ``random.Random(seed)`` a pipeline
(:mod:`tests.fuzzing.recipes`), a service and 5-15 operations: take items,
break out and ``iter()`` again, ``state_dict()`` (also from another thread
while this one waits in ``next()``), ``load_state_dict()`` into the same
loader or a new one on another service, ``set_epoch``, ``end_epoch``,
``shutdown``, ``len``, ``placement``, ``stats``, and dropping the loader
without ``shutdown()`` under ``gc.disable()`` (its worker processes must be
gone at once: docs/reading_services.md, "Lifecycle"). The same operations run
in lockstep on in-process loaders (the reference); each operation's result
(items as :func:`plain` values, a state's epoch and count, ``len``, or the
type of the error raised) must be the same. Services deliver in order here,
so items compare as lists. The outcome kinds are those of
:mod:`tests.fuzzing.resume`, plus ``LEAK`` (a worker process outlived its
loader), a failure, and ``late``: with ``stats=True`` the workers of a loader
dropped right after ``iter()`` stopped within 2 s but not at once (the
statistics sampler held the loader's frames for one sample; known, not a
failure).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import pickle
import random
import tempfile
import threading
import warnings
from typing import Any

from pipeloom import DataLoader
from pipeloom.errors import PlanError

from .recipes import build, random_recipe, write_files
from .resume import REFUSALS, Outcome, Watchdog, guarded, make_service, plain, random_service

KINDS = ("in_process", "threads", "processes", "auto")
OPS = (
    "next",
    "iter",
    "state",
    "state_blocked",
    "shutdown_blocked",
    "load_blocked",
    "iter_blocked",
    "end_epoch_blocked",
    "load",
    "set_epoch",
    "end_epoch",
    "shutdown",
    "len",
    "placement",
    "stats",
    "drop",
)
WEIGHTS = (6, 4, 3, 2, 1, 1, 1, 1, 3, 1, 1, 1, 1, 1, 1, 1)


@dataclasses.dataclass
class Plan:
    """What one seed draws: the pipeline, the loaders' settings, the operations."""

    recipe: dict[str, Any]
    seed: int
    service: tuple
    stats: bool
    replay: bool
    ops: list[tuple]

    def describe(self) -> str:
        return (
            f"recipe={self.recipe} loader_seed={self.seed} service={self.service} "
            f"stats={self.stats} replay={self.replay} ops={self.ops}"
        )


def draw_plan(seed: int, kinds: tuple[str, ...] = KINDS) -> Plan:
    rng = random.Random(seed)
    recipe = random_recipe(rng)
    plan = Plan(
        recipe=recipe,
        seed=rng.randrange(1000),
        service=_service(rng, kinds, recipe),
        stats=rng.random() < 0.2,
        replay=rng.random() < 0.2,
        ops=[],
    )
    plan.ops = [_op(rng, kinds, recipe) for _ in range(rng.randint(5, 15))]
    return plan


def _service(rng: random.Random, kinds: tuple[str, ...], recipe: dict[str, Any]) -> tuple:
    if recipe["cache_over_random"]:  # replays its first epoch exactly only in-process
        return ("in_process",)
    if "auto" in kinds and rng.random() < 0.1:
        return ("auto",)
    plain_kinds = tuple(kind for kind in kinds if kind != "auto") or ("in_process",)
    return random_service(rng, plain_kinds, recipe["batched"], unordered=0.0)


def _op(rng: random.Random, kinds: tuple[str, ...], recipe: dict[str, Any]) -> tuple:
    name = rng.choices(OPS, WEIGHTS)[0]
    if name in ("next", "iter"):
        return (name, rng.choice([0, 1, 1, 2, 3, 5, 1000]))
    if name == "load":  # the state saved n-th from last; into this loader or a new one
        where = rng.choice(["same", "fresh"])
        return (name, rng.randrange(3), _service(rng, kinds, recipe) if where == "fresh" else None)
    if name == "set_epoch":
        return (name, rng.choice([0, 1, 2, 5]))
    if name == "drop":  # (after a new iter() and k items); then a new loader on this service
        return (name, _service(rng, kinds, recipe), rng.choice([None, None, 0, 1, 3]))
    return (name,)


def _make(description: tuple) -> Any:
    return "auto" if description == ("auto",) else make_service(description, timeout=30)


# -- the process tree ---------------------------------------------------------------------
def children() -> dict[int, str]:
    """This process's live child processes (a zombie counts), each with its state letter."""
    found: dict[int, str] = {}
    me = os.getpid()
    for task in os.listdir(f"/proc/{me}/task"):
        try:
            with open(f"/proc/{me}/task/{task}/children") as file:
                pids = [int(pid) for pid in file.read().split()]
        except OSError:
            continue  # the thread ended meanwhile
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as file:
                    command = file.read().replace(b"\0", b" ").decode(errors="replace")
                with open(f"/proc/{pid}/stat") as file:
                    letter = file.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue  # gone meanwhile
            if "resource_tracker" in command or "forkserver" in command:
                continue  # multiprocessing's helpers live as long as this process
            found[pid] = letter
    return found


def _gone_within(pids: set[int], seconds: float) -> bool:
    """Whether the child processes ``pids`` end within ``seconds`` (a fuzzer's verdict)."""
    pause = threading.Event()
    for _ in range(int(seconds / 0.05)):
        if not pids & set(children()):
            return True
        pause.wait(0.05)
    return not pids & set(children())


# -- one side: a loader and what the operations did to it ---------------------------------
class Side:
    """The current loader of one side (the service's, or the reference's) and its states."""

    def __init__(
        self, plan: Plan, root: str, watchdog: Watchdog, reference: bool, epochs: Any
    ) -> None:
        self.plan, self.root, self.watchdog, self.reference = plan, root, watchdog, reference
        self.epochs = epochs  # epoch -> its items uninterrupted (None: not checked)
        self.off: str | None = None  # where items taken were not the epoch's
        self.states: list[dict] = []
        self.loader: DataLoader | None = None
        self.iterator: Any = None
        self.started: Any = None  # an iterator another thread started (iter_blocked)
        self.baseline = set(children())  # processes that are not this side's
        self.new_loader(plan.service)

    def new_loader(self, service: tuple) -> None:
        """Replace the loader (shut down) with a new one over a new build of the pipeline."""
        if self.loader is not None:
            self.loader.shutdown()
        self.iterator = None
        try:
            self.loader = self._loader(("in_process",) if self.reference else service)
        except PlanError:  # this service cannot run the pipeline: in-process runs any
            self.loader = self._loader(("in_process",))

    def _loader(self, service: tuple) -> DataLoader:
        return self.watchdog.loader(
            build(self.plan.recipe, self.root),
            _make(service),
            seed=self.plan.seed,
            # the reference saves every position (by replay where a block cannot):
            # a state the service gives must be exact, one it refuses is a refusal
            resume_by_replay=self.plan.replay or self.reference,
            stats=self.plan.stats,
        )

    def apply(self, op: tuple, hint: Any = None) -> Any:
        """The operation's result (plain data); an exception becomes ``("raised", ...)``."""
        return self._attempt(getattr(self, "_" + op[0]), *op[1:], hint=hint)

    def _take(self, partial: list, hint: Any, count: int) -> tuple:
        iterator = self.iterator
        epoch, start = getattr(iterator, "epoch", None), getattr(iterator, "delivered", None)
        items: list = []
        partial.append(items)
        for _ in range(count):
            try:
                items.append(plain(next(iterator)))
            except StopIteration:
                self._check(epoch, start, items, ended=True)
                return (items, "end")
        self._check(epoch, start, items, ended=False)
        return (items,)

    def _check(self, epoch: int | None, start: int | None, items: list, ended: bool) -> None:
        """Note where ``items`` (from item ``start`` of ``epoch``) are not that epoch's."""
        whole = self.epochs(epoch) if epoch is not None and start is not None else None
        if whole is None or self.off is not None:
            return
        assert start is not None
        if items != whole[start : start + len(items)] or (
            ended and start + len(items) != len(whole)
        ):
            expected = whole[start : start + len(items)]
            self.off = (
                f"items {start}..{start + len(items)} of epoch {epoch}{' (its end)' * ended} "
                f"are {_short(items)}, the uninterrupted epoch's {_short(expected)} "
                f"(of {len(whole)})"
            )

    def _next(self, partial: list, hint: Any, count: int) -> tuple:
        if self.iterator is None:
            self.iterator = iter(self.loader)
        return self._take(partial, None, count)

    def _iter(self, partial: list, hint: Any, count: int) -> tuple:
        self.iterator = None
        self.iterator = iter(self.loader)
        return self._take(partial, None, count)

    def _state(self, partial: list, hint: Any, remember: bool = True) -> tuple:
        state = pickle.loads(pickle.dumps(self.loader.state_dict()))
        if remember:
            self.states.append(state)
        return ("state", state["seed"], state["epoch"], state["delivered"])

    def _state_blocked(self, partial: list, hint: Any) -> tuple:
        return self._blocked(hint, self._state)

    def _shutdown_blocked(self, partial: list, hint: Any) -> tuple:
        return self._blocked(hint, self._shutdown)

    def _load_blocked(self, partial: list, hint: Any) -> tuple:
        return self._blocked(hint, self._load, 0, None)

    def _iter_blocked(self, partial: list, hint: Any) -> tuple:
        try:
            return self._blocked(hint, self._start)
        finally:  # the new epoch's iterator is the one read from now on
            self.iterator, self.started = self.started or self.iterator, None

    def _end_epoch_blocked(self, partial: list, hint: Any) -> tuple:
        return self._blocked(hint, self._end_epoch)

    def _start(self, partial: list, hint: Any) -> tuple:
        self.started = iter(self.loader)
        return ("started",)

    def _blocked(self, hint: Any, action: Any, *args: Any) -> tuple:
        """``action`` (state_dict, shutdown, load_state_dict, iter, end_epoch) from another
        thread during ``next()``.

        Which comes first is a race; the reference runs the action on the side of the
        item that the service's did (``hint``: "before" or "after"). Afterwards,
        the state (the position that a shutdown kept, or the loaded one).
        """
        if self.iterator is None:
            self.iterator = iter(self.loader)
        before = (getattr(self.iterator, "epoch", None), getattr(self.iterator, "delivered", None))
        if hint == "before":
            done = self._attempt(action, *args)
            items = self._attempt(self._take, 1)
        elif hint == "after":
            items = self._attempt(self._take, 1)
            done = self._attempt(action, *args)
        else:
            go, box = threading.Event(), []
            thread = threading.Thread(
                target=lambda: (go.wait(), box.append(self._attempt(action, *args)))
            )
            thread.start()
            go.set()
            try:
                items = self._attempt(self._take, 1)
            finally:
                thread.join()
            done = box[0]
            if action == self._state:  # the state says which came first
                hint = "before" if done[2:] == before else "after"
            else:  # a next() that came second raises (LoaderShutDown: a RuntimeError)
                hint = "before" if items[-1][:1] == ("raised",) else "after"
        if items[-1][:1] == ("raised",) and items[-1][1] == "LoaderShutDown":
            items = (*items[:-1], ("raised", "RuntimeError", False))
        after = () if action == self._state else (self._attempt(self._state, remember=False),)
        return (done, hint, items, *after)

    def _attempt(self, step: Any, *args: Any, hint: Any = None, **kwargs: Any) -> Any:
        """``step(partial, hint, *args)``'s result, or what it made and ``("raised", ...)``.

        ``("raised", type name, whether a refusal)`` stands for the exception.
        """
        partial: list = []
        try:
            return step(partial, hint, *args, **kwargs)
        except Exception as error:  # noqa: BLE001 - compared with the reference's
            if self.watchdog.fired.is_set():
                raise
            return (*partial, ("raised", type(error).__name__, isinstance(error, REFUSALS)))

    def _load(self, partial: list, hint: Any, back: int, service: tuple | None) -> tuple:
        if not self.states:
            return ("no state",)
        state = self.states[-1 - back % len(self.states)]
        if service is not None:
            self.new_loader(service)
        self.loader.load_state_dict(state)
        return ("loaded",)

    def _set_epoch(self, partial: list, hint: Any, epoch: int) -> tuple:
        self.loader.set_epoch(epoch)
        return ("epoch", self.loader.epoch, self.loader.next_epoch)

    def _end_epoch(self, partial: list, hint: Any) -> tuple:
        self.loader.end_epoch()
        return ("ended", self.loader.next_epoch)

    def _shutdown(self, partial: list, hint: Any) -> tuple:
        self.loader.shutdown()
        return ("shut down",)

    def _len(self, partial: list, hint: Any) -> tuple:
        return ("len", len(self.loader))

    def _placement(self, partial: list, hint: Any) -> tuple:
        self.loader.placement()
        return ("placed",)

    def _stats(self, partial: list, hint: Any) -> tuple:
        self.loader.stats()
        return ("stats",)

    def _drop(self, partial: list, hint: Any, service: tuple, take: int | None) -> tuple:
        """Drop the loader and its iterator without ``shutdown()``; then a new loader.

        ``take``: first a new epoch and that many of its items (None: as it is).
        """
        items = () if take is None else (self._iter(partial, None, take),)
        left: dict[int, str] = {}
        enabled = gc.isenabled()
        gc.disable()
        try:
            before = children()
            loader, self.loader, self.iterator = self.loader, None, None
            self.watchdog.loaders.remove(loader)
            del loader  # the last reference: its workers stop at once
            left = {p: s for p, s in children().items() if p in before and p not in self.baseline}
        finally:
            if enabled:
                gc.enable()
        self.new_loader(service)
        if left:
            gone = _gone_within(set(left), seconds=2.0)
            if gone and self.plan.stats:  # known: the statistics sampler held the loader
                return ("LATE", f"worker processes {left} stopped only after the drop")
            return ("LEAK", f"worker processes left after the loader was dropped: {left}")
        return ("dropped", *items)


# -- one example --------------------------------------------------------------------------
def run_lifecycle_example(
    seed: int, kinds: tuple[str, ...] = KINDS, watchdog_s: float = 60.0
) -> Outcome:
    """Run the example of ``seed``; never raises for what a pipeline or service does."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. a redundant sharding_filter; not what is checked
        return run_plan(draw_plan(seed, kinds), seed, watchdog_s)


def run_plan(plan: Plan, seed: int = -1, watchdog_s: float = 60.0) -> Outcome:
    """Run one drawn (or hand-edited, when minimising) plan."""
    with tempfile.TemporaryDirectory(prefix="pipeloom-fuzz-") as root:
        write_files(root, plan.recipe["size"])
        baseline = children()
        kind, detail = guarded(watchdog_s, lambda dog: _lockstep(plan, root, dog))
        left = {pid: s for pid, s in children().items() if pid not in baseline}
        if left and kind not in ("error", "hang", "WRONG", "LEAK"):
            kind, detail = "LEAK", f"worker processes left after shutdown(): {left}"
    return Outcome(seed, kind, detail, plan.describe())


def _lockstep(plan: Plan, root: str, watchdog: Watchdog) -> tuple[str, str]:
    epochs = Epochs(plan, root)
    service = Side(plan, root, watchdog, reference=False, epochs=epochs)
    reference = Side(plan, root, watchdog, reference=True, epochs=epochs)
    ops = [*plan.ops, ("iter", 1000)]  # a last whole epoch: do they still agree?
    for number, op in enumerate(ops):
        got = service.apply(op)
        hint = got[1] if op[0].endswith("_blocked") and len(got) >= 3 else None
        expected = reference.apply(op, hint)
        if got[:1] in (("LEAK",), ("LATE",)):
            return got[0].lower() if got[0] == "LATE" else "LEAK", f"op {number} {op}: {got[1]}"
        for side, name in ((service, "the service"), (reference, "in-process")):
            if side.off is not None:
                return "WRONG", f"op {number} {op}: under {name}, {side.off}"
        blocked = op[0] == "state_blocked" and len(got) >= 3
        if op[0] == "state" or blocked:  # a state the service cannot save: not remembered
            if _refused(got[0] if blocked else got, expected[0] if blocked else expected):
                reference.states.pop()
        if _agree(got, expected):
            continue
        raised = got[-1] if isinstance(got[-1], tuple) and got[-1][:1] == ("raised",) else ()
        if raised and raised[2] and expected[-1] != raised:
            return "refused", f"op {number} {op}: {raised[1]}"
        return "WRONG", f"op {number} {op}: got {_short(got)}, expected {_short(expected)}"
    return "ok", f"{len(ops)} operations"


class Epochs:
    """Each epoch's items read uninterrupted in-process by a new loader (the oracle).

    None where that is no oracle: the pipeline fails, or an ``in_memory_cache``
    replays the first epoch it cached (docs/caching.md), whichever that was.
    """

    def __init__(self, plan: Plan, root: str) -> None:
        self.plan, self.root = plan, root
        self.cached: dict[int, list | None] = {}
        steps = (*plan.recipe["prefix"], *plan.recipe["per_item"], *plan.recipe["tail"])
        self.checked = all(step[0] != "in_memory_cache" for step in steps)

    def __call__(self, epoch: int) -> list | None:
        if not self.checked:
            return None
        if epoch not in self.cached:
            try:
                with DataLoader(build(self.plan.recipe, self.root), seed=self.plan.seed) as loader:
                    loader.set_epoch(epoch)
                    self.cached[epoch] = [plain(x) for x in loader]
            except Exception:  # noqa: BLE001 - the pipeline itself fails: no oracle
                self.cached[epoch] = None
        return self.cached[epoch]


def _refused(got: Any, expected: Any) -> bool:
    """Whether the service refused (``StateError``) a state that the reference took."""
    return (
        isinstance(got, tuple)
        and got[-1:] == (("raised", "StateError", True),)
        and isinstance(expected, tuple)
        and expected[:1] == ("state",)
    )


def _agree(got: Any, expected: Any) -> bool:
    """Equal, but where the service refused a state (``StateError``) the reference took."""
    if got == expected or _refused(got, expected):
        return True
    if not (isinstance(got, tuple) and isinstance(expected, tuple)):
        return False
    return len(got) == len(expected) and all(map(_agree, got, expected))


def _short(result: Any) -> str:
    return repr(result)[:400]
