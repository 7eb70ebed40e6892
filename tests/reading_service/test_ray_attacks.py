"""RayReadingService attacked from outside: kills after a checkpoint, moves between
services, placements that cannot be met, arguments Ray would refuse late.

One local cluster (2 CPUs, no dashboard) serves the module and test_ray.py; each Ray loader starts
its own actors, so the module uses one.
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import signal
import tarfile
import threading
import time
import types

import psutil
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'pipeloom[ray]')")

from pipeloom import DataLoader  # noqa: E402
from pipeloom.datapipes import FileLister, IterableWrapper  # noqa: E402
from pipeloom.errors import WorkerError, WorkerTimeout  # noqa: E402
from pipeloom.reading_service import RayReadingService, ThreadReadingService  # noqa: E402
from pipeloom.reading_service.strategies.ray_actors import channel  # noqa: E402
from pipeloom.reading_service.strategies.ray_actors.handle import (  # noqa: E402
    ActorHandle,
    Cluster,
)
from tests.reading_service import pipelines, ray_pipelines  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cluster(ray_cluster):
    """The session's cluster (tests/reading_service/conftest.py), shared with test_ray.py."""


def tar_shards(folder):
    for shard in range(5):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for i in range(2 + shard % 3):  # shards of 2 to 4 members
                data = bytes([shard, i]) * 20
                info = tarfile.TarInfo(f"s{shard}-{i}.bin")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        (folder / f"shard-{shard}.tar").write_bytes(buffer.getvalue())


def test_an_actor_killed_right_after_a_checkpoint_and_the_checkpoint_under_threads(
    cluster, tmp_path
):
    tar_shards(tmp_path)

    def pipe():
        return (
            FileLister(str(tmp_path), "*.tar")
            .shuffle()
            .sharding_filter()
            .open_files("rb")
            .load_from_tar()
            .map(pipelines.member_name)
            .map(ray_pipelines.drawn_where)
            .filter(ray_pipelines.not_member_1)
            .flatmap(ray_pipelines.copies)
            .batch(3)
            .unbatch()
        )

    def without_pid(items):
        return [(name, draw) for name, draw, _ in items]

    with DataLoader(pipe(), None, seed=3) as loader:
        expected = without_pid(loader)
    assert len(expected) == 9 * 400
    ray_service = RayReadingService(
        2, num_cpus_per_actor=0.5, max_restarts=1, prefetch_factor=1, timeout=60
    )
    with DataLoader(pipe(), ray_service, seed=3) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(5)]  # mid-position: a flatmap gives 400
        saved = pickle.loads(pickle.dumps(loader.state_dict()))
        # position 0's actor (0), with three tar shards: >= 1200 outputs, more than it buffers
        os.kill(head[-1][2], signal.SIGKILL)
        rest = list(iterator)
    assert without_pid(head + rest) == expected  # nothing lost or repeated, same draws
    assert len({pid for *_, pid in head + rest}) == 3  # two actors, one restarted
    with DataLoader(pipe(), ThreadReadingService(2), seed=3) as loader:
        loader.load_state_dict(saved)
        assert without_pid(head + list(loader)) == expected


def test_an_actor_stuck_in_an_item_times_out_at_once_and_is_replaced_at_the_next_epoch(
    cluster, tmp_path
):
    # The abandoned epoch used to join the reader waiting on the stuck actor for
    # JOIN_TIMEOUT (10 s) before the WorkerTimeout was raised; and the next epoch's
    # call waited behind the stuck one in the actor: a timeout again (or, without
    # a timeout, a hang until the item ended).
    marker = tmp_path / "stuck"
    stuck = functools.partial(ray_pipelines.stuck_once, at=1, marker=str(marker))
    pipe = IterableWrapper(range(10)).sharding_filter().map(stuck)
    ray_service = RayReadingService(1, num_cpus_per_actor=0.5, timeout=1)
    with DataLoader(pipe, ray_service, seed=0) as loader:
        iterator = iter(loader)
        assert next(iterator) == 0
        started = time.monotonic()
        with pytest.raises(WorkerTimeout, match="within timeout=1 s"):
            next(iterator)
        assert time.monotonic() - started < 5
        stuck_actor = psutil.Process(int(marker.read_text()))
        assert list(loader) == list(range(10))  # on a fresh actor, not behind the stuck one
        assert psutil.wait_procs([stuck_actor], timeout=10)[1] == []  # the stuck one killed
        started = time.monotonic()
    assert time.monotonic() - started < 5  # shutdown()
    assert not any("pipeloom-ray-reader" in t.name for t in threading.enumerate())


def test_actors_no_node_can_place_raise_naming_the_resources_they_ask_for(cluster):
    pipe = FileLister(".", "*.toml").sharding_filter()
    ray_service = RayReadingService(
        1,
        num_cpus_per_actor=0.5,
        start_timeout=0.5,
        ray_options={"resources": {"pipeloom_test_box": 1}},
    )
    started = time.monotonic()
    with DataLoader(pipe, ray_service, seed=0) as loader:
        with pytest.raises(TimeoutError) as info:
            list(loader)
    message = str(info.value)
    assert "did not start within start_timeout=0.5 s" in message
    assert "ray_options resources {'pipeloom_test_box': 1}" in message
    assert "'pipeloom_test_box': 0" in message and "ray start --resources" in message
    assert time.monotonic() - started < 30


def test_a_local_cluster_a_service_started_stops_with_its_last_user_only(monkeypatch):
    # Two loaders without ray.init(): the first started Ray, and its shutdown() used to
    # stop it under the second's actors ("TypeError: No owner found for object").
    ray_state = {"up": False, "job": 0, "calls": []}

    def init(**kwargs):
        ray_state.update(up=True, job=ray_state["job"] + 1)
        ray_state["calls"].append("init")

    def shutdown():
        ray_state["up"] = False
        ray_state["calls"].append("shutdown")

    def context():
        return types.SimpleNamespace(get_job_id=lambda: f"job{ray_state['job']}")

    monkeypatch.setattr(ray, "is_initialized", lambda: ray_state["up"])
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", shutdown)
    monkeypatch.setattr(ray, "get_runtime_context", context)
    first, second = Cluster(None), Cluster(None)
    first.connect()
    second.connect()
    first.release()
    first.release()  # idempotent
    assert ray_state["calls"] == ["init"]  # the second's actors still run
    second.release()
    assert ray_state["calls"] == ["init", "shutdown"]
    init()  # a connection the user made is the user's to stop
    users = Cluster(None)
    users.connect()
    users.release()
    assert ray_state["calls"][-1] == "init" and ray_state["up"]
    shutdown()
    ours = Cluster(None)
    ours.connect()
    shutdown()
    init()  # the user restarted Ray meanwhile: not ours to stop any more
    ours.release()
    assert ray_state["calls"][-2:] == ["shutdown", "init"] and ray_state["up"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"num_cpus_per_actor": float("inf")},
            "num_cpus_per_actor must be a finite number of CPUs",
        ),
        ({"num_cpus_per_actor": -0.5}, "got -0.5; e.g. 1, or 0.5"),
        ({"timeout": float("inf")}, "timeout must be a finite .*pass None to wait"),
        ({"start_timeout": float("inf")}, "start_timeout must be a finite .*e.g. 3600"),
        ({"ray_options": {"num_cpus": 2}}, "may not set 'num_cpus' .*pass num_cpus_per_actor="),
        ({"ray_options": {"max_restarts": 5}}, "may not set 'max_restarts' .*pass max_restarts="),
        ({"ray_options": {"max_task_retries": 1}}, "may not set 'max_task_retries'.*remove it"),
        ({"ray_options": {"concurrency_groups": {}}}, "may not set 'concurrency_groups'"),
    ],
)
def test_arguments_ray_would_refuse_late_or_never_are_refused_at_once(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RayReadingService(1, **kwargs)


def test_ray_shut_down_under_a_running_epoch_is_named_not_hidden_by_a_cancel(monkeypatch):
    # After ray.shutdown() under a running epoch, ray.cancel of the epoch's call raised
    # "TypeError: No owner found for object", which replaced the reader's error, itself
    # a bare "AttributeError: 'Worker' object has no attribute 'core_worker'".
    def no_owner(call):
        raise TypeError("No owner found for object.")

    monkeypatch.setattr(ray, "cancel", no_owner)
    channel._cancel(object())  # the call is gone with Ray: nothing to cancel
    lost = AttributeError("'Worker' object has no attribute 'core_worker'")
    error = channel._as_worker_error(lost, "ray actor 0", ray_up=False)
    assert isinstance(error, WorkerError) and error.__cause__ is lost
    assert str(error).startswith("ray actor 0: reading its outputs failed with AttributeError")
    assert "Ray was shut down meanwhile: call the loader's shutdown()" in str(error)


class _FakeActor:
    """A Ray actor handle whose ``where()`` call is a token for ``ray.get`` to answer."""

    def __init__(self):
        self.where = self

    def options(self, **kwargs):
        return self

    def remote(self):
        return "where() call"


def test_rays_own_count_decides_a_restart_and_is_the_count_the_error_names(monkeypatch):
    # The handle counted restarts itself: a call lost to a blip (ActorUnavailableError,
    # ObjectLostError) counted as a restart Ray never made, so max_restarts=0 raised
    # "restarts are spent" for a live actor; and an actor killed with ray.kill after one
    # of its two restarts was said to have spent both.
    from ray._private import state

    where = {"pid": 7, "node_ip": "10.0.0.5", "node_id": "5e6f7a8b" * 4, "actor_id": "1a2b" * 8}
    answers: list = [where]

    def get(call, timeout=None):
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    ray_restarts = {"NumRestarts": 0}
    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(state, "actors", lambda actor_id: ray_restarts)
    actor = ActorHandle(_FakeActor(), 0, max_restarts=0, start_timeout=5)
    actor.restarted(ray.exceptions.ActorUnavailableError("connection reset", None))
    assert actor.where == where and not actor.dead  # alive: the epoch is replayed
    actor.max_restarts = 2
    for restarts, why in [
        (1, "Ray restarts it no more after 1 of its 2 restarts (max_restarts): the cause"),
        (2, "its 2 restarts (max_restarts, counted over its life, across epochs) are spent"),
    ]:
        ray_restarts["NumRestarts"] = restarts
        answers.append(ray.exceptions.ActorDiedError())  # Ray restarts it no more
        with pytest.raises(WorkerError) as info:
            actor.restarted(RuntimeError("the call's death"))
        message = str(info.value)
        assert message.startswith("ray actor 0 (actor 1a2b1a2b, pid 7, node 10.0.0.5 id 5e6f")
        assert why in message and "the next epoch starts a fresh actor in its place" in message
        assert actor.dead  # replaced at the next epoch
