"""``python -m pipeloom profile module:function``: run a pipeline, show where the time goes."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ..autotune import AutoReadingService, Budget, Config
from ..datapipes import as_datapipe
from ..loader import DataLoader
from ..reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ReadingService,
    ThreadReadingService,
)
from ..stats import LoaderStats
from ._plots import write_placement_graph, write_timeline
from ._progress import Progress

__all__ = ["UsageError", "auto_service", "load_target", "make_loader", "profile", "items_in"]

STRATEGIES = ("in-process", "threads", "classic", "economic", "chunked")


class UsageError(ValueError):
    """The command line asked for something it cannot do: one line to stderr, exit status 2.

    Errors of the user's own code (building the pipeline, running it) are not usage
    errors: they keep their traceback, which names the block and the item.
    """


def load_target(spec: str) -> Callable[[], Any]:
    """``"package.module:function"`` -> the function (the current directory is importable)."""
    module_name, sep, function_name = spec.partition(":")
    if not sep or not module_name or not function_name:
        raise UsageError(
            f"expected module:function (e.g. my_project.data:build_pipeline), got {spec!r}"
        )
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is None or not _names_part_of(error.name, module_name):
            raise  # an import inside the user's module failed: its traceback says where
        raise UsageError(
            f"cannot import {module_name!r} ({error}); run from the folder that holds it, "
            f"or add that folder to PYTHONPATH"
        ) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise UsageError(
            f"{module_name} has no function {function_name!r}; it should return a pipeline "
            f"or a DataLoader"
        )
    return function


def _names_part_of(missing: str, module_name: str) -> bool:
    """Whether the module that was not found is ``module_name`` or a package above it."""
    return module_name == missing or module_name.startswith(missing + ".")


def built_by(spec: str, function: Callable[[], Any]) -> Any:
    """What the user's function returns: a DataLoader, or anything ``DataLoader`` takes."""
    made = function()
    if not isinstance(made, DataLoader):
        try:
            as_datapipe(made)
        except TypeError as error:
            raise UsageError(f"{spec} returned {type(made).__name__}: {error}") from None
    return made


def service_for(strategy: str | None, workers: int | None) -> ReadingService:
    """The reading service the command-line options name."""
    if strategy is None:
        strategy = "classic" if workers else "in-process"
    if strategy == "in-process":
        if workers:
            raise UsageError("--workers needs a strategy other than in-process")
        return InProcessReadingService()
    if workers == 0:
        raise UsageError(
            f"--workers 0 runs no workers, but --strategy {strategy} needs at least 1; drop "
            f"--workers (2 by default) or use --strategy in-process"
        )
    count = workers or 2
    if strategy == "threads":
        return ThreadReadingService(count)
    return MultiProcessingReadingService(count, strategy=strategy)


def auto_service(strategy: str | None, workers: int | None) -> AutoReadingService:
    """The autotuned service ``--auto`` runs; ``--strategy``/``--workers`` pick where it starts."""
    if strategy in ("in-process", "economic", "chunked"):
        raise UsageError(
            f"--auto tunes threads and classic worker processes; it cannot start from "
            f"--strategy {strategy} (drop it, or use --strategy threads or classic)"
        )
    if strategy is None and workers is None:
        return AutoReadingService()
    if workers == 0:
        raise UsageError(
            "--auto starts with at least 1 worker, got --workers 0; drop --workers, or give "
            "the count to start from"
        )
    kind = "threads" if strategy == "threads" else "processes"
    budget = Budget.of_this_machine()
    most = budget.max_threads if kind == "threads" else budget.max_processes
    if workers is not None and workers > most:
        raise UsageError(
            f"--auto --workers {workers}: the tuner's budget on this machine allows at most "
            f"{most} worker {kind}; give --workers {most} or fewer (it adds workers itself "
            f"while the loader is slow)"
        )
    return AutoReadingService(start=Config(kind, workers or 1), budget=budget)


def autotune_line(report: dict[str, Any]) -> str:
    """What ``--auto`` chose, in one line."""
    if report.get("settled") or report.get("config") is None or not report.get("best"):
        return f"autotune chose: {report['chosen']}"
    return (
        f"autotune: best measured {Config(**report['best'])}; it was still measuring when "
        f"the run ended (running {report['chosen']}); run longer (--batches) to let it settle"
    )


def make_loader(
    made: Any, strategy: str | None, workers: int | None, auto: bool = False
) -> DataLoader:
    """A loader collecting statistics, from what the user's function returned."""
    if isinstance(made, DataLoader):
        if auto:  # the same pipeline and seed, autotuned
            return DataLoader(
                made.datapipe, auto_service(strategy, workers), seed=made.seed, stats=True
            )
        if strategy is not None or workers is not None:
            raise UsageError(
                "the function returned a DataLoader, which has its reading service already; "
                "--workers and --strategy apply to a function that returns a pipeline"
            )
        # A new loader on the same pipeline, service and seed, with statistics on.
        return DataLoader(made.datapipe, made.reading_service, seed=made.seed, stats=True)
    service = auto_service(strategy, workers) if auto else service_for(strategy, workers)
    return DataLoader(made, service, stats=True)


def items_in(output: Any) -> int:
    """How many items an output holds: a batch's length, else 1."""
    try:
        return len(output)
    except TypeError:
        return 1


def run(
    loader: DataLoader,
    *,
    batches: int | None,
    label: str,
    use_tqdm: bool = True,
) -> LoaderStats:
    """Iterate ``loader`` (up to ``batches`` outputs), with a progress line; its statistics."""
    refreshed = 0.0
    readiness: float | None = None
    with Progress(label, total=batches, use_tqdm=use_tqdm) as progress:
        for count, output in enumerate(loader, 1):
            now = time.perf_counter()
            if now - refreshed >= 0.5:
                refreshed = now
                readiness = loader.stats().readiness
            progress.update(items=items_in(output), readiness=readiness)
            if batches is not None and count >= batches:
                break
    return loader.stats()


def profile(
    spec: str,
    *,
    workers: int | None,
    strategy: str | None,
    batches: int | None,
    out: str,
    auto: bool,
) -> int:
    """The ``profile`` command; returns the exit status."""
    made = built_by(spec, load_target(spec))
    with make_loader(made, strategy, workers, auto) as loader:
        placement = loader.placement()
        print(placement)
        stats = run(loader, batches=batches, label="profile (autotuned)" if auto else "profile")
        placement = loader.placement()  # autotune may have re-placed it
    print(stats)
    if stats.autotune is not None:
        print(autotune_line(stats.autotune))
    os.makedirs(out, exist_ok=True)
    report = {"target": spec, "placement": str(placement), "stats": stats.to_dict()}
    report_path = os.path.join(out, "report.json")
    with open(report_path, "w") as f:
        json.dump(report, f, indent=2)
    print(f"report: {report_path}")
    print(write_timeline(stats, os.path.join(out, "timeline.png")))
    print(write_placement_graph(placement, os.path.join(out, "placement")))
    return 0
