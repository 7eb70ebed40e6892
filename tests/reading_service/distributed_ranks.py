"""Rank programs for test_distributed.py: one process per rank.

:func:`launch` starts ``world`` ranks on 127.0.0.1 (gloo; forked from one spawned
launcher, :func:`fork_ranks`), runs the named scenarios in each and returns
``{scenario: [result of rank 0, rank 1, ...]}``.
A scenario's exception becomes its result ``("error", type name, message)``.
Every rank process dumps its stack and exits after ``limit`` seconds, and
the launcher kills what is left, so a test never hangs.
"""

from __future__ import annotations

import datetime
import faulthandler
import multiprocessing
import os
import pickle
import socket
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, SequenceWrapper
from pipeloom.reading_service import (
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
    ThreadReadingService,
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(processes: list[Any], limit: float) -> None:
    """Start the rank ``processes``, wait up to ``limit + 5`` s, kill what is still running."""
    for process in processes:
        process.start()
    deadline = time.monotonic() + limit + 5
    try:
        for process in processes:
            process.join(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        for process in processes:
            if process.exitcode is None:
                process.kill()
                process.join(5)


def fork_ranks(
    target: Callable[..., None],
    rank_args: list[tuple],
    limit: float,
    launcher: RankLauncher | None = None,
    *,
    shared_event: bool = False,
) -> list[Any]:
    """Run ``target(*args)`` in one process per ``rank_args``; their exit codes, rank by rank.

    The ranks are forked from one spawned launcher, a fresh interpreter that imports
    torch and ``target``'s module once for all of them, then forks before anything
    else runs (no process group, no gloo thread, no lock held; only the BLAS pool
    numpy starts at import, which handles fork, as under any forked DataLoader
    worker): each rank starts as clean as a spawned one without importing torch
    itself (seconds per rank on a busy machine). The launcher gives each rank
    ``limit + 5`` s (``run_ranks``) and is itself killed 10 s after that.

    ``launcher``: a :class:`RankLauncher` kept for several launches (a module's
    fixture), so torch is imported once for all of them; None: a launcher for this
    launch only. ``shared_event``: each rank gets one more argument, a
    ``multiprocessing.Event`` the ranks share (made in the launcher, inherited).
    """
    if launcher is not None:
        return launcher.run(target, rank_args, limit, shared_event)
    with RankLauncher() as one_off:
        return one_off.run(target, rank_args, limit, shared_event)


class RankLauncher:
    """A spawned launcher that forks the ranks of one launch after another (``fork_ranks``).

    It only ever forks and joins: between launches it holds no process group, no
    thread and no lock, so each launch's ranks start as clean as from a fresh one.
    A launch that overruns its limit kills it; the next launch starts another.
    """

    def __init__(self) -> None:
        self._process: Any = None
        self._conn: Any = None

    def __enter__(self) -> RankLauncher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def run(
        self, target: Callable[..., None], rank_args: list[tuple], limit: float, shared_event: bool
    ) -> list[Any]:
        if self._process is None:
            context = multiprocessing.get_context("spawn")
            self._conn, child_conn = context.Pipe()
            self._process = context.Process(target=_serve_launches, args=(child_conn,))
            self._process.start()
            child_conn.close()
        self._conn.send((target, rank_args, limit, shared_event))
        try:  # the first launch also waits for the launcher to import torch
            if self._conn.poll(limit + 15):
                return self._conn.recv()
        except (EOFError, OSError):
            pass
        return [self.close(kill=True)] * len(rank_args)

    def close(self, kill: bool = False) -> int | None:
        """End the launcher (at once with ``kill``); its exit code."""
        if self._process is None:
            return None
        if not kill:
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._process.join(10)
        if self._process.exitcode is None:
            self._process.kill()
            self._process.join(5)
        self._conn.close()
        exitcode = self._process.exitcode
        self._process = self._conn = None
        return exitcode


def _serve_launches(conn) -> None:
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        target, rank_args, limit, shared_event = request
        context = multiprocessing.get_context("fork")
        if shared_event:
            event = context.Event()
            rank_args = [(*args, event) for args in rank_args]
        processes = [context.Process(target=target, args=args) for args in rank_args]
        run_ranks(processes, limit)
        conn.send([process.exitcode for process in processes])


def launch(
    scenarios: list[str],
    world: int,
    tmp_path,
    *,
    limit: float = 200.0,
    shared_event: bool = False,
    launcher: RankLauncher | None = None,
) -> dict[str, list[Any]]:
    """``shared_event``: the ranks share a ``multiprocessing.Event`` (``stuck_rank``)."""
    port = free_port()
    args = [(scenarios, rank, world, port, str(tmp_path), limit) for rank in range(world)]
    exitcodes = fork_ranks(_rank_main, args, limit, launcher, shared_event=shared_event)
    results: dict[str, list[Any]] = {name: [] for name in scenarios}
    for rank in range(world):
        path = os.path.join(tmp_path, f"rank{rank}.pkl")
        found = {}
        if os.path.exists(path):
            with open(path, "rb") as file:
                found = pickle.load(file)
        for name in scenarios:
            results[name].append(found.get(name, ("missing", exitcodes[rank])))
    return results


def _rank_main(scenarios, rank, world, port, out_dir, limit, event=None) -> None:
    faulthandler.dump_traceback_later(limit, exit=True)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=limit / 2),
    )
    torch.manual_seed(1000 + rank)  # local seeds differ: agreeing is the service's job
    results: dict[str, Any] = {}
    path = os.path.join(out_dir, f"rank{rank}.pkl")
    for name in scenarios:
        try:
            results[name] = SCENARIOS[name](rank, world, event)
        except Exception as error:  # noqa: BLE001 - the test inspects it
            results[name] = ("error", type(error).__name__, str(error))
        with open(path + ".tmp", "wb") as file:  # written after each scenario: crashes keep it
            pickle.dump(results, file)
        os.replace(path + ".tmp", path)
    dist.destroy_process_group()


def epochs(pipe, service, epochs: int = 2, **loader_args) -> tuple[int, list[list[Any]]]:
    with DataLoader(pipe, service, **loader_args) as loader:
        return loader.seed, [list(loader) for _ in range(epochs)]


# -- scenarios ------------------------------------------------------------------


def shuffled(n: int):
    return IterableWrapper(range(n)).shuffle().sharding_filter().map(lambda x: x * 10)


def partition(rank: int, world: int, event: Any) -> dict[str, Any]:
    even = 6 * world
    uneven = 6 * world + 1
    seq = SequentialReadingService
    return {
        "in-process": epochs(shuffled(even), DistributedReadingService()),
        "processes": epochs(shuffled(even), seq(DistributedReadingService(), _mp(2))),
        "threads": epochs(
            shuffled(even), seq(DistributedReadingService(), ThreadReadingService(3))
        ),
        "uneven": epochs(shuffled(uneven), DistributedReadingService()),
        "uneven-step": epochs(
            shuffled(uneven).filter(lambda x: x % 20 == 0),
            seq(DistributedReadingService(), _mp(2)),
        ),
        "pad": epochs(shuffled(uneven), DistributedReadingService("pad")),
        "pad-step": epochs(shuffled(uneven), DistributedReadingService("pad", end_check="step")),
        "batched": [
            epochs(_batched(), service, seed=1)[1]
            for service in (
                DistributedReadingService(),
                seq(DistributedReadingService(), _mp(2)),
                seq(DistributedReadingService(), ThreadReadingService(3)),
            )
        ],
        "empty": epochs(shuffled(1), DistributedReadingService()),
        "empty-step": epochs(shuffled(1), DistributedReadingService(end_check="step")),
        "empty-processes": epochs(shuffled(1), seq(DistributedReadingService(), _mp(2))),
        "empty-pad": _error_of(lambda: epochs(shuffled(1), DistributedReadingService("pad"))),
    }


def _mp(workers: int) -> MultiProcessingReadingService:
    # Not fork: a rank runs gloo's threads, and a child forked from a multithreaded
    # process can deadlock before it runs any Python (seen here, rarely, under load).
    # The fork server is started once per rank with pipeloom preloaded, so each
    # worker starts in a fraction of a second (spawn would import torch in each).
    return MultiProcessingReadingService(workers, start_method="forkserver", timeout=20)


def _batched():
    """map is one-to-one: batches are built in the workers (runs of 4 positions per shard)."""
    return SequenceWrapper(range(30)).to_iter().map(lambda x: x + 1).batch(4)


def _error_of(run: Callable[[], Any]) -> tuple[str, str]:
    try:
        run()
    except Exception as error:  # noqa: BLE001
        return type(error).__name__, str(error)
    return "no error", ""


def resume(rank: int, world: int, event: Any) -> dict[str, Any]:
    """For each case: (uninterrupted epoch 1, head + resumed tail, the epoch after)."""
    uneven = 6 * world + 1
    cases: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "in-process": (lambda: shuffled(uneven), DistributedReadingService),
        "processes": (
            _batched,
            lambda: SequentialReadingService(DistributedReadingService(), _mp(2)),
        ),
        "pad-step": (
            lambda: shuffled(uneven).filter(lambda x: x % 20 == 0),
            lambda: DistributedReadingService("pad", end_check="step"),
        ),
        "pad": (lambda: shuffled(4 * world + 1), lambda: DistributedReadingService("pad")),
        "pad-long": (  # rank 1 keeps one item and repeats it: resumes mid-padding
            lambda: IterableWrapper(range(6 * world)).sharding_filter().filter(_mostly_rank_0),
            lambda: DistributedReadingService("pad", end_check="step"),
        ),
    }
    out = {}
    for name, (build, service) in cases.items():
        for stop in (1, 4):
            out[f"{name}@{stop}"] = _resume_once(build, service, stop)
    return out


def _mostly_rank_0(x: int) -> bool:
    return x < 2 or x % 2 == 0


def _resume_once(build, service, stop: int):
    with DataLoader(build(), service(), seed=5) as loader:
        list(loader)
        expected = list(loader)
        following = list(loader)
    with DataLoader(build(), service(), seed=5) as loader:
        list(loader)
        iterator = iter(loader)
        head = [next(iterator) for _ in range(min(stop, len(expected)))]
        state = pickle.loads(pickle.dumps(loader.state_dict()))
    with DataLoader(build(), service(), seed=6) as resumed:
        resumed.load_state_dict(state)
        tail = list(resumed)
        after = list(resumed)
    return expected, head + tail, following, after


def mismatched_epochs(rank: int, world: int, event: Any) -> tuple[str, str]:
    def run():
        with DataLoader(shuffled(10), DistributedReadingService(timeout=10)) as loader:
            loader.set_epoch(rank)
            list(loader)

    return _error_of(run)


def raises_on_one_rank(rank: int, world: int, event: Any) -> tuple[str, str, float]:
    """Rank 1's pipeline raises at its third item; step mode stops every rank at once."""

    def boom(x):
        if rank == 1 and x >= 0:
            boom.count = getattr(boom, "count", 0) + 1
            if boom.count == 3:
                raise KeyError("bad sample on rank 1")
        return x

    start = time.monotonic()
    pipe = IterableWrapper(range(40)).sharding_filter().map(boom)
    kind, message = _error_of(
        lambda: epochs(pipe, DistributedReadingService(end_check="step", timeout=10))
    )
    return kind, message, time.monotonic() - start


def crash_on_one_rank(rank: int, world: int, event: Any) -> tuple[str, str, float]:
    """Rank 1 dies (os._exit) mid-epoch; the others must fail, not hang."""
    start = time.monotonic()

    def run():
        with DataLoader(
            shuffled(40), DistributedReadingService(end_check="step", timeout=10)
        ) as loader:
            for step, _ in enumerate(loader):
                if rank == 1 and step == 2:
                    os._exit(3)

    kind, message = _error_of(run)
    return kind, message, time.monotonic() - start


def stuck_rank(rank: int, world: int, event: Any) -> tuple[str, str, float]:
    """Rank 1 stops iterating (alive, stuck); the others fail after the loader's timeout."""
    start = time.monotonic()

    def run():
        loader = DataLoader(shuffled(40), DistributedReadingService(end_check="step", timeout=2))
        for step, _ in enumerate(loader):
            if rank == 1 and step == 2:
                event.wait(30)  # released by rank 0 once it has failed
                return

    kind, message = _error_of(run)
    if rank == 0:
        event.set()
    return kind, message, time.monotonic() - start


SCENARIOS: dict[str, Callable[[int, int, Any], Any]] = {
    "partition": partition,
    "resume": resume,
    "mismatched_epochs": mismatched_epochs,
    "raises_on_one_rank": raises_on_one_rank,
    "crash_on_one_rank": crash_on_one_rank,
    "stuck_rank": stuck_rank,
}
