"""RayReadingService on a local Ray cluster: the in-process output, restarts, checkpoints.

One cluster (2 CPUs, a small object store, no dashboard) serves the module (and
test_ray_attacks.py: the session's ``ray_cluster``).
Each loader starts its own actors (a Ray worker process each, importing
torch), so the tests use few loaders.
"""

from __future__ import annotations

import functools
import io
import itertools
import os
import pickle
import tarfile
import time

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'pipeloom[ray]')")

from pipeloom import DataLoader  # noqa: E402
from pipeloom.datapipes import FileLister, IterableWrapper  # noqa: E402
from pipeloom.errors import WorkerError  # noqa: E402
from pipeloom.reading_service import (  # noqa: E402
    InProcessReadingService,
    MultiProcessingReadingService,
    RayReadingService,
)
from tests.reading_service import pipelines, ray_pipelines  # noqa: E402
from tests.reading_service.random_pipelines import build, recipes  # noqa: E402

pytestmark = pytest.mark.timeout(120)
CPUS = 0.5  # per actor: three actors fit on the 2-CPU cluster


@pytest.fixture(scope="module", autouse=True)
def cluster(ray_cluster):
    """The session's cluster (tests/reading_service/conftest.py), shared with test_ray_attacks."""


def service(actors=2, **kwargs):
    kwargs.setdefault("num_cpus_per_actor", CPUS)
    kwargs.setdefault("timeout", 60)
    return RayReadingService(actors, **kwargs)


def epochs(pipe_factory, reading_service, count=2, seed=0):
    with DataLoader(pipe_factory(), reading_service, seed=seed) as loader:
        return [list(loader) for _ in range(count)]


def in_process(pipe_factory, count=2, seed=0):
    return epochs(pipe_factory, None, count, seed)


# -- the output ---------------------------------------------------------------------


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=recipes, actors=st.integers(1, 3), seed=st.integers(0, 2**20))
def test_random_pipelines_give_the_in_process_output(recipe, actors, seed):
    assert epochs(lambda: build(recipe), service(actors), seed=seed) == in_process(
        lambda: build(recipe), seed=seed
    )


def test_filters_flatmaps_item_rng_and_arrays_through_the_object_store():
    def pipe():
        return (
            IterableWrapper(range(40))
            .shuffle()
            .sharding_filter()
            .filter(ray_pipelines.odd)
            .flatmap(ray_pipelines.wide)
            .map(ray_pipelines.array_of)
        )

    expected = [[a.tolist() for a in epoch] for epoch in in_process(pipe)]
    got = epochs(pipe, service(3, prefetch_factor=1))
    assert [[a.tolist() for a in epoch] for epoch in got] == expected
    assert len(expected[0]) == 40 and expected[0] != expected[1]  # redrawn per epoch
    assert all(a.dtype == "float32" and a.shape == (4, 4) for a in got[0])


def test_tar_shards_and_whole_batches_built_in_the_actors(tmp_path):
    for shard in range(5):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for i in range(4):
                data = bytes([shard, i]) * 50
                info = tarfile.TarInfo(f"s{shard}-{i}.bin")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        (tmp_path / f"shard-{shard}.tar").write_bytes(buffer.getvalue())

    def pipe():
        return (
            FileLister(str(tmp_path), "*.tar")
            .shuffle()
            .sharding_filter()
            .open_files("rb")
            .load_from_tar()
            .map(pipelines.member_name)
            .batch(3)
        )

    expected = in_process(pipe, count=3)
    assert sum(len(batch) for batch in expected[0]) == 20
    with DataLoader(pipe(), service(2), seed=0) as loader:
        assert next(iter(loader)) == expected[0][0]  # epoch 0 abandoned after one batch
        assert [list(loader) for _ in range(2)] == expected[1:]
        assert loader.placement().strategy == "ray"
    with DataLoader(pipe(), service(2, in_order=False), seed=0) as loader:
        unordered = list(loader)
    names = sorted(name for batch in unordered for name in batch)  # batched in arrival order
    assert names == sorted(name for batch in expected[0] for name in batch)


def test_seeds_worker_info_lazy_init_and_worker_init_fn_as_in_processes():
    def pipe():
        return ray_pipelines.LazyPid(8).sharding_filter().map(ray_pipelines.who)

    processes = epochs(pipe, MultiProcessingReadingService(2), seed=5)
    actors = epochs(pipe, service(2, worker_init_fn=ray_pipelines.init_marks), seed=5)
    # item, worker id and count, global RNG draw: as in worker processes, both epochs
    assert [[(i, *rest) for (i, _), *rest in e] for e in actors] == [
        [(i, *rest) for (i, _), *rest in e] for e in processes
    ]
    assert [(i, wid, n) for (i, _), wid, n, _ in actors[0]] == [(i, i % 2, 2) for i in range(8)]
    lazy_pids = {pid for (_, pid), *_ in actors[0]}  # lazy_init ran in each actor
    assert len(lazy_pids) == 2 and None not in lazy_pids and os.getpid() not in lazy_pids


def test_an_exception_in_an_actor_names_the_actor_block_and_item():
    pipe = IterableWrapper(range(10)).sharding_filter().map(pipelines.explode_at_seven)
    with DataLoader(pipe, service(2), seed=0) as loader:
        with pytest.raises(KeyError, match="bad sample") as info:
            list(loader)
    message = str(info.value)
    assert "ray actor 1 (pid" in message and "Mapper(fn=explode_at_seven" in message
    assert "position 7" in message and isinstance(info.value.__cause__, WorkerError)


# -- faults -------------------------------------------------------------------------


def test_an_actor_killed_mid_epoch_is_restarted_and_replays_exactly(tmp_path):
    def pipe(marker):
        return (
            IterableWrapper(range(60))
            .shuffle()
            .sharding_filter()
            .map(functools.partial(ray_pipelines.kill_once, at=33, marker=marker))
            .filter(ray_pipelines.odd)
            .flatmap(ray_pipelines.wide)
            .map(pipelines.draw)
        )

    spent = tmp_path / "spent"  # kill_once kills nothing once its marker exists
    spent.write_text("")
    expected = in_process(lambda: pipe(str(spent)), count=1)
    marker = tmp_path / "killed"
    ray_service = service(2, max_restarts=1, prefetch_factor=1)
    assert epochs(lambda: pipe(str(marker)), ray_service, count=1) == expected
    assert marker.exists()  # an actor was killed


def test_an_actor_killed_from_outside_is_replaced_and_shutdown_leaves_no_actor():
    def pipe():
        return IterableWrapper(range(300)).sharding_filter().map(ray_pipelines.with_pid).batch(5)

    expected = [[x for x, _ in batch] for batch in in_process(pipe, count=1)[0]]
    with DataLoader(pipe(), service(2, max_restarts=2, prefetch_factor=1), seed=0) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(3)]
        os.kill(head[1][0][1], 9)  # the actor that built batch 1
        rest = list(iterator)
    assert [[x for x, _ in batch] for batch in head + rest] == expected
    pids = {pid for batch in head + rest for _, pid in batch}
    assert len(pids) == 3 and os.getpid() not in pids  # two actors, one restarted
    processes = []
    for pid in pids:
        try:
            processes.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass  # already gone
    _, alive = psutil.wait_procs(processes, timeout=30)
    assert alive == []  # shutdown() ended every actor process


def test_exhausted_restarts_raise_a_worker_error_naming_actor_node_and_cause_then_a_fresh_actor(
    tmp_path,
):
    # The epochs after the error used to raise it again at once: the dead actor stayed.
    deaths = functools.partial(ray_pipelines.kill_twice, at=5, marker=str(tmp_path / "deaths"))
    pipe = IterableWrapper(range(40)).sharding_filter().map(deaths)
    started = time.monotonic()
    with DataLoader(pipe, service(2, max_restarts=1), seed=0) as loader:
        with pytest.raises(WorkerError) as info:
            list(loader)  # item 5 kills actor 1, and again after its one restart
        assert time.monotonic() - started < 100  # raised, not hung until the test's timeout
        assert list(loader) == list(range(40))  # the next epoch: a fresh actor in its place
    message = str(info.value)
    assert message.startswith("ray actor 1 (actor ")
    assert "node " in message and "Cause (" in message
    assert "its 1 restarts (max_restarts, counted over its life, across epochs)" in message


def test_a_slow_consumer_keeps_each_actor_bounded(tmp_path):
    log = tmp_path / "made"
    pipe = (
        IterableWrapper(itertools.count())
        .sharding_filter()
        .map(functools.partial(ray_pipelines.counted, path=str(log)))
        .batch(4)
    )
    with DataLoader(pipe, service(1, prefetch_factor=2), seed=0) as loader:
        iterator = iter(loader)
        assert next(iterator) == [0, 1, 2, 3]
        time.sleep(3)  # room for a producer without backpressure to run far ahead
        made = len(log.read_text().splitlines())
    # batches: 1 taken, 2 in the object store, 1 in the reader's hand-over, 1 being
    # handed over, 1 in the actor's queue, 1 being built
    assert made <= 7 * 4


# -- checkpoints and composition ------------------------------------------------------


def test_a_checkpoint_resumes_exactly_under_ray_and_moves_to_processes_and_back():
    def pipe():
        return pipelines.augmented()

    with DataLoader(pipe(), MultiProcessingReadingService(2), seed=1) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(3)]
        saved = pickle.loads(pickle.dumps(loader.state_dict()))
    expected = epochs(pipe, None, count=1, seed=1)[0]
    with DataLoader(pipe(), service(2), seed=1) as loader:
        loader.load_state_dict(saved)
        iterator = iter(loader)
        middle = [next(iterator) for _ in range(2)]
        saved = loader.state_dict()
    with DataLoader(pipe(), MultiProcessingReadingService(1), seed=1) as loader:
        loader.load_state_dict(saved)
        assert head + middle + list(loader) == expected


def test_each_rank_runs_its_own_actors_on_its_shard():
    def pipe():
        return IterableWrapper(range(30)).shuffle().sharding_filter().map(pipelines.draw)

    reference = InProcessReadingService()
    reference.set_outer_sharding(2, 1)
    inner = service(2)
    inner.set_outer_sharding(2, 1)
    assert epochs(pipe, inner) == epochs(pipe, reference)


# -- arguments --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"num_actors": -1}, ValueError, "num_actors must be an int >= 0"),
        ({"num_actors": 1, "prefetch_factor": 0}, ValueError, "prefetch_factor"),
        ({"num_actors": 1, "max_restarts": -1}, ValueError, "max_restarts"),
        ({"num_actors": 1, "num_cpus_per_actor": -1}, ValueError, "num_cpus_per_actor"),
        ({"num_actors": 1, "ray_address": 5}, TypeError, "ray_address must be a str"),
    ],
)
def test_bad_arguments_are_explained(kwargs, error, message):
    with pytest.raises(error, match=message):
        RayReadingService(**kwargs)


def test_zero_actors_run_in_the_calling_thread():
    pipe = IterableWrapper(range(5)).sharding_filter().map(ray_pipelines.with_pid)
    with DataLoader(pipe, RayReadingService(0), seed=0) as loader:
        assert list(loader) == [(x, os.getpid()) for x in range(5)]
