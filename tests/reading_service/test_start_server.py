"""Spawn through pipeloom's start server: same batches, one server, nothing left, deaths raise."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeloom
from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.errors import WorkerError
from pipeloom.reading_service import MultiProcessingReadingService
from pipeloom.reading_service.workers import start_server
from pipeloom.reading_service.workers.process import Payload, worker_context
from tests.own_resources import OwnResources, wait_for_exit
from tests.reading_service import pipelines

pytestmark = pytest.mark.timeout(120)  # a hang detector: the first server imports torch


def with_pid(x):
    return (x, os.getpid())


def _spawn(workers: int = 2, **kwargs) -> MultiProcessingReadingService:
    return MultiProcessingReadingService(workers, start_method="spawn", timeout=60, **kwargs)


def test_spawn_uses_the_start_server_unless_turned_off(monkeypatch):
    assert isinstance(worker_context("spawn"), start_server.ServedContext)
    monkeypatch.setenv("PIPELOOM_SPAWN_SERVER", "0")
    assert not isinstance(worker_context("spawn"), start_server.ServedContext)


def test_a_spawn_service_starts_the_server_before_the_first_epoch():
    _spawn(2)
    server = start_server._server  # noqa: SLF001
    assert server is not None and server.alive()
    _spawn(2)
    assert start_server._server is server  # noqa: SLF001 - one per process


@settings(max_examples=4, deadline=None)
@given(
    workers=st.integers(1, 3),
    seed=st.integers(0, 2**16),
    n=st.integers(0, 30),
    persistent=st.booleans(),
)
def test_spawned_batches_equal_forked_ones(workers, seed, n, persistent):
    fork = MultiProcessingReadingService(
        workers, start_method="fork", persistent_workers=persistent
    )
    with DataLoader(pipelines.augmented(n), fork, seed=seed) as loader:
        expected = [list(loader), list(loader)]
    spawn = _spawn(workers, persistent_workers=persistent)
    with DataLoader(pipelines.augmented(n), spawn, seed=seed) as loader:
        assert [list(loader), list(loader)] == expected


def _tree(pids: set[int]) -> tuple[set[int], set[int]]:
    """(the parents of ``pids``, their parents)."""
    parents = {psutil.Process(pid).ppid() for pid in pids}
    return parents, {psutil.Process(pid).ppid() for pid in parents}


def test_a_second_loader_reuses_the_server_and_workers_fork_from_a_template():
    trees = []
    for _ in range(2):
        pipe = IterableWrapper(range(8)).sharding_filter().map(with_pid)
        with DataLoader(pipe, _spawn(2, persistent_workers=True), seed=0) as loader:
            items = list(loader)
            assert [x for x, _ in items] == list(range(8))
            workers = {pid for _, pid in items}
            assert len(workers) == 2 and os.getpid() not in workers
            trees.append(_tree(workers))
    (templates1, servers1), (templates2, servers2) = trees
    server = start_server._server  # noqa: SLF001
    assert server is not None
    assert servers1 == servers2 == {server.pid}  # one server for both loaders
    assert len(templates1) == len(templates2) == 1 and templates1 != templates2
    assert psutil.Process(server.pid).ppid() == os.getpid()


def test_persistent_workers_start_the_next_epoch_without_new_processes():
    pipe = IterableWrapper(range(8)).sharding_filter().map(with_pid)
    with DataLoader(pipe, _spawn(2, persistent_workers=True), seed=0) as loader:
        first = {pid for _, pid in loader}
        second = {pid for _, pid in loader}
    assert first == second


def test_shutdown_leaves_no_template_worker_or_descriptor():
    list(DataLoader(IterableWrapper(range(4)).sharding_filter(), _spawn(1), seed=0))  # server up
    before = OwnResources()
    for persistent in (False, True):
        pipe = IterableWrapper(range(100)).sharding_filter().map(pipelines.draw)
        with DataLoader(pipe, _spawn(2, persistent_workers=persistent), seed=0) as loader:
            for i, _ in enumerate(loader):
                if i == 3:
                    break
            assert len(list(loader)) == 100
    before.assert_released(timeout=10)


def test_a_killed_spawned_worker_raises():
    pipe = IterableWrapper(range(20)).sharding_filter().map(pipelines.kill_self_at)
    with DataLoader(pipe, _spawn(2), seed=0) as loader:
        with pytest.raises(
            WorkerError, match=r"worker process \d \(pid \d+\) was killed by signal 9 \(SIGKILL\)"
        ):
            list(loader)


def test_an_error_in_a_spawned_worker_names_its_origin():
    pipe = IterableWrapper(range(20)).sharding_filter().map(pipelines.explode_at_seven)
    with DataLoader(pipe, _spawn(2), seed=0) as loader:
        with pytest.raises(KeyError, match=r"(?s)bad sample.*raised in worker process \d \(pid"):
            list(loader)


def _refuse_to_unpickle():
    raise RuntimeError("this block cannot be rebuilt in another process")


class RefusesToUnpickle(IterableWrapper):
    """Pickles fine; unpickling it (in the template) raises."""

    def __reduce__(self):
        return _refuse_to_unpickle, ()


def test_a_pipeline_the_template_cannot_unpickle_fails_each_worker_instead_of_hanging():
    pipe = RefusesToUnpickle(range(8)).sharding_filter()
    with DataLoader(pipe, _spawn(2), seed=0) as loader:
        with pytest.raises(
            RuntimeError,
            match=r"(?s)this block cannot be rebuilt.*raised in worker process \d \(pid \d+\), "
            r"unpickling the pipeline sent to it",
        ):
            list(loader)


_USER = textwrap.dedent(
    """
    import os, sys
    import psutil
    from pipeloom import DataLoader
    from pipeloom.datapipes import IterableWrapper
    from pipeloom.reading_service import MultiProcessingReadingService

    def with_pid(x):
        return (x, os.getpid())

    if __name__ == "__main__":
        service = MultiProcessingReadingService(2, start_method="spawn", timeout=60)
        loader = DataLoader(IterableWrapper(range(100)).sharding_filter().map(with_pid), service)
        iterator = iter(loader)
        _, worker = next(iterator)
        template = psutil.Process(worker).ppid()
        server = psutil.Process(template).ppid()
        print(server, template, worker, flush=True)
        if sys.argv[1] == "kill":
            os.kill(os.getpid(), 9)
    """
)


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_the_user_process_ending_ends_server_template_and_workers(tmp_path, how):
    script = tmp_path / "user.py"
    script.write_text(_USER)
    root = str(Path(pipeloom.__file__).parents[1])  # this checkout's pipeloom
    env = {**os.environ, "PYTHONPATH": root}
    done = subprocess.run(
        [sys.executable, str(script), how], capture_output=True, text=True, timeout=100, env=env
    )
    assert done.returncode == (0 if how == "exit" else -9), done.stderr
    pids = [int(pid) for pid in done.stdout.split()]
    assert len(pids) == 3
    assert wait_for_exit(pids, timeout=10) == []


def test_after_an_unpicklable_pipeline_the_server_still_starts_templates():
    lock = threading.Lock()  # cannot be pickled
    bad = IterableWrapper(range(4)).sharding_filter().map(lambda x, lock=lock: x)
    with DataLoader(bad, _spawn(1), seed=0) as loader:
        with pytest.raises(TypeError, match="cannot be pickled"):
            list(loader)
    server = start_server.start_server()
    with DataLoader(IterableWrapper(range(6)).sharding_filter(), _spawn(2), seed=0) as loader:
        assert sorted(loader) == list(range(6))
    assert start_server.start_server() is server and server.alive()


def _register_exit_marker(path: str, payload: Any) -> None:
    import atexit
    import multiprocessing.util

    atexit.register(Path(path + ".atexit").touch)
    multiprocessing.util.Finalize(None, Path(path + ".finalize").touch, exitpriority=0)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_served_worker_runs_its_exit_handlers_as_multiprocessing_forked_children_do(
    tmp_path, start_method
):
    # Python 3.13 moved a forked child's exit handlers (multiprocessing's Finalize, atexit)
    # from Process._bootstrap to popen_fork: a worker forked by a template ran none, so
    # worker processes' statistics (written by a Finalize) went missing under spawn.
    marker = str(tmp_path / start_method)
    context = worker_context(start_method)
    payload = Payload(IterableWrapper([1]), context, start_timeout=60)
    try:
        process = context.Process(
            target=_register_exit_marker, args=(marker, payload), name="exit-handlers"
        )
        process.start()
        process.join(60)
        assert process.exitcode == 0
        process.close()
    finally:
        payload.close()
    ran = {kind for kind in ("atexit", "finalize") if Path(f"{marker}.{kind}").exists()}
    assert "finalize" in ran  # on every Python
    assert ("atexit" in ran) == (sys.version_info >= (3, 13))  # as popen_fork's children
