"""Attacks on the spawn path: atoms.py's fast pickling keeps data, types and sharing;
a dataset that fails to unpickle in the template is named, and nothing hangs."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.errors import NotAvailable, WorkerError
from pipeloom.reading_service import MultiProcessingReadingService
from pipeloom.reading_service.strategies.classic import process_pool
from pipeloom.reading_service.workers import atoms
from tests.own_resources import OwnResources

pytestmark = pytest.mark.timeout(120)


class Holder:
    """A plain object: its attributes are looked at."""

    def __init__(self, **attributes):
        self.__dict__.update(attributes)


class Name(str):
    """A ``str`` subclass: must come back as itself, not as a ``str``."""


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a, self.b = a, b


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: list
    b: list


class Stated:
    """``__getstate__`` hands over a new dict holding the same list twice."""

    def __init__(self, files):
        self.files = files

    def __getstate__(self):
        return {"files": self.files, "again": self.files}


@pytest.fixture(autouse=True)
def _fast_for_short_lists(monkeypatch):
    monkeypatch.setattr(atoms, "MIN_ITEMS", 3)
    monkeypatch.setattr(atoms, "_FRAME", -(1 << 30))  # fast, however short the list


def _same_graph(a, b, seen: dict[int, int] | None = None) -> None:
    """``b`` equals ``a``, with the same types and the same sharing (strings aside)."""
    seen = {} if seen is None else seen
    assert type(a) is type(b), (a, b)
    if isinstance(a, (str, bytes, int, float, type(None), np.ndarray)):
        assert a == b if not isinstance(a, np.ndarray) else (a == b).all()
        return
    if id(a) in seen:
        assert seen[id(a)] == id(b), f"shared {type(a).__name__} came back as two objects"
        return
    assert id(b) not in seen.values(), f"two {type(a).__name__}s came back as one"
    seen[id(a)] = id(b)
    if isinstance(a, (list, tuple, bytearray)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same_graph(x, y, seen)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _same_graph(a[key], b[key], seen)
    elif hasattr(a, "__dict__"):
        _same_graph(vars(a), vars(b), seen)
    else:
        for slot in a.__slots__:
            _same_graph(getattr(a, slot), getattr(b, slot), seen)


def _check(obj) -> None:
    """``obj`` comes back from atoms.py as it comes back from plain pickle."""
    _same_graph(pickle.loads(pickle.dumps(obj)), pickle.loads(atoms.dumps(obj)))


# -- regressions: sharing kept whatever the order --------------------------------
def test_a_list_in_an_attribute_and_in_a_later_dict_stays_one_list():
    files = [f"f{i}" for i in range(10)]
    back = pickle.loads(atoms.dumps(Holder(files=files, index={"files": files})))
    assert back.files is back.index["files"]  # was two lists: the dict's pickled again
    back = pickle.loads(atoms.dumps(Holder(files=files, nested=[files, [files]])))
    assert back.files is back.nested[0] is back.nested[1][0]
    back.files.append("new")  # a dataset appending to one list sees it in the other
    assert back.nested[1][0][-1] == "new"


def test_a_list_repeating_one_string_is_left_to_the_memo(monkeypatch):
    monkeypatch.setattr(atoms, "MIN_ITEMS", 4096)
    labels = ["train"] * 100_000
    data = atoms.dumps(Holder(labels=labels))
    assert len(data) < 2 * len(pickle.dumps(Holder(labels=labels)))  # was 3.5 times
    back = pickle.loads(data).labels
    assert back == labels and len({id(s) for s in back}) == 1  # was 100,000 strings


def test_a_list_referenced_from_another_object_and_from_itself():
    files = [f"f{i}" for i in range(10)]
    loop = ["a", "b", "c"]
    loop.append(loop)  # mixed: pickled as usual, the cycle kept
    _check(Holder(files=files, other=Holder(files=files), loop=loop, tuple=tuple(files)))


def test_odd_strings_and_containers_come_back_equal():
    odd = ["", "\udcff", "\x00", "é" * 3, "x" * 1_000_000, "\U0001f600", "a\udc80b"]
    _check(
        Holder(
            odd=odd,
            raw=[b"", b"\xff", b"\x00" * 10, bytes(range(256))],
            names=[Name("a"), Name("b"), Name("c")],  # a subclass: pickled as usual
            some_names=["a", Name("b"), "c"],
            mixed=["a", None, 1, "b"],
            arrays=np.array(odd[:4]),
            objects=np.array(["a", "b", "c", None], dtype=object),
            buffer=bytearray(b"abc"),
            empty=[],
        )
    )
    back = pickle.loads(atoms.dumps(Holder(names=[Name("a")] * 3, odd=odd)))
    assert all(type(name) is Name for name in back.names) and back.odd == odd


def test_slots_frozen_dataclasses_and_getstate_keep_their_sharing():
    files = [f"f{i}" for i in range(10)]
    for obj in (Slotted(files, files), Frozen(files, files), Holder(s=Stated(files), f=files)):
        _check(obj)
    back = pickle.loads(atoms.dumps(Stated(files)))
    assert back.files is back.again and back.files == files


_texts = st.one_of(st.text(max_size=6), st.sampled_from(["", "\udcff", "é"]))
_leaf_lists = st.one_of(
    st.lists(_texts, min_size=3, max_size=12),
    st.lists(st.binary(max_size=6), min_size=3, max_size=12),
    st.lists(st.one_of(_texts, st.none(), st.integers()), min_size=3, max_size=12),
    st.lists(_texts.map(Name), min_size=3, max_size=12),
)


@st.composite
def _graphs(draw):
    """Objects, dicts and lists sharing a pool of lists of strings, in any order."""
    pool = [
        tuple(items) if draw(st.booleans()) else items
        for items in draw(st.lists(_leaf_lists, min_size=1, max_size=4))
    ]
    refs = st.sampled_from(range(len(pool))).map(pool.__getitem__)
    nodes: list = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["object", "dict", "list", "slots", "stated"]))
        parts = draw(st.lists(st.one_of(refs, st.sampled_from(nodes or [None])), max_size=4))
        if kind == "object":
            nodes.append(Holder(**{f"a{i}": part for i, part in enumerate(parts)}))
        elif kind == "dict":
            nodes.append({f"k{i}": part for i, part in enumerate(parts)})
        elif kind == "list":
            nodes.append(parts)
        elif kind == "slots":
            nodes.append(Slotted(*(parts + [None, None])[:2]))
        else:
            nodes.append(Stated(draw(refs)))
    return draw(st.permutations(nodes))


@settings(max_examples=150, deadline=None)
@given(graph=_graphs())
def test_any_graph_comes_back_as_plain_pickle_gives_it(graph):
    _check(graph)


# -- end to end: spawned workers see the same dataset ----------------------------
class Table:
    """A map-style dataset whose lists are shared between attributes and a dict."""

    def __init__(self, n: int) -> None:
        odd = ("\udcff", "é")  # a surrogate (os.fsdecode of a non-UTF-8 name), an accent
        self.paths = [f"/data/{i:06d}-{odd[i % 7 == 0]}.jpg" for i in range(n)]
        self.raw = [str(i).encode() for i in range(n)]
        self.labels = ["cat", "dog"] * (n // 2)
        self.index = {"paths": self.paths}
        self.again = self.paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        shared = self.index["paths"] is self.paths is self.again
        return i, self.paths[i], self.raw[i], self.labels[i], shared


@pytest.mark.parametrize("server", ["1", "0"])
def test_a_spawned_map_style_dataset_equals_the_in_process_one(monkeypatch, server):
    monkeypatch.setattr(atoms, "MIN_ITEMS", 4096)
    monkeypatch.setenv("PIPELOOM_SPAWN_SERVER", server)
    table = Table(2 * 4096)
    expected = [table[i] for i in range(len(table))]
    service = MultiProcessingReadingService(2, start_method="spawn", timeout=60)
    pipe = IterableWrapper(range(len(table))).sharding_filter().map(table.__getitem__)
    with DataLoader(pipe, service, seed=0) as loader:
        assert sorted(loader) == expected


# -- a dataset that fails or hangs while the template unpickles it ---------------
def _refuse(message):
    raise RuntimeError(message)


class Unloadable:
    """Pickles, but raises when unpickled (in the template)."""

    def __reduce__(self):
        return _refuse, ("cannot open /data/table.parquet here",)

    def __call__(self, x):
        return x


def _slow_load(seconds):
    if str(os.getpid()) != os.environ.get("ATTACK_MAIN_PID"):  # the main process copies it
        time.sleep(seconds)  # (economic): only the template is slow
    return SlowToLoad(seconds)


class SlowToLoad:
    def __init__(self, seconds):
        self.seconds = seconds

    def __reduce__(self):
        return _slow_load, (self.seconds,)

    def __call__(self, x):
        return x


@pytest.mark.parametrize("persistent", [False, True])
def test_a_dataset_failing_to_unpickle_names_the_error_and_leaves_nothing(persistent):
    list(DataLoader(IterableWrapper(range(2)).sharding_filter(), _spawn(1), seed=0))  # server up
    before = OwnResources()
    pipe = IterableWrapper(range(8)).sharding_filter().map(Unloadable())
    with pytest.raises(RuntimeError, match="cannot open /data/table.parquet here") as raised:
        with DataLoader(pipe, _spawn(2, persistent_workers=persistent), seed=0) as loader:
            list(loader)  # was "worker process 0 exited with code 1", the cause on stderr only
    assert "unpickling the pipeline sent to it" in str(raised.value)
    assert isinstance(raised.value.__cause__, WorkerError)
    before.assert_released(timeout=10)


def test_a_dataset_failing_to_unpickle_is_named_when_its_worker_exited_before_the_epoch(
    monkeypatch,
):
    # A worker that failed to unpickle its pipeline reports it and exits. When it had exited
    # before the main process sent it the epoch (a busy machine), the failed send raised
    # "worker process 0 exited with code 0 before finishing its epoch" (1 run in 12 under
    # load), the reason left unread in its queue.
    start_epoch = process_pool._Processes.start_epoch

    def after_the_workers_exit(processes, *args, **kwargs):
        for worker in processes.workers:
            worker.process.join(10)
        return start_epoch(processes, *args, **kwargs)

    monkeypatch.setattr(process_pool._Processes, "start_epoch", after_the_workers_exit)
    pipe = IterableWrapper(range(8)).sharding_filter().map(Unloadable())
    with pytest.raises(RuntimeError, match="cannot open /data/table.parquet here") as raised:
        with DataLoader(pipe, _spawn(2, persistent_workers=True), seed=0) as loader:
            list(loader)
    assert "unpickling the pipeline sent to it" in str(raised.value)


def test_a_dataset_slow_to_unpickle_is_waited_for_then_read_whole():
    pipe = IterableWrapper(range(8)).sharding_filter().map(SlowToLoad(1.0))
    with DataLoader(pipe, _spawn(2, persistent_workers=True), seed=0) as loader:
        assert sorted(loader) == list(range(8))
        assert sorted(loader) == list(range(8))


def test_a_loader_closed_while_its_workers_start_leaves_nothing():
    list(DataLoader(IterableWrapper(range(2)).sharding_filter(), _spawn(1), seed=0))  # server up
    before = OwnResources()
    pipe = IterableWrapper(range(8)).sharding_filter().map(SlowToLoad(2.0))
    loader = DataLoader(pipe, _spawn(2), seed=0)
    iter(loader)  # starts the workers: the template still sleeps in __reduce__'s call
    loader.shutdown()
    assert isinstance(loader.state_dict(), dict)  # the position stays askable
    before.assert_released(timeout=10)


@pytest.mark.parametrize("strategy", ["classic", "economic"])
def test_a_template_stuck_unpickling_raises_within_the_timeout_and_is_ended(monkeypatch, strategy):
    monkeypatch.setenv("ATTACK_MAIN_PID", str(os.getpid()))
    list(DataLoader(IterableWrapper(range(2)).sharding_filter(), _spawn(1), seed=0))  # server up
    before = OwnResources()
    pipe = IterableWrapper(range(8)).sharding_filter().map(SlowToLoad(1000.0)).batch(2)
    service = MultiProcessingReadingService(2, start_method="spawn", timeout=3, strategy=strategy)
    with pytest.raises(TimeoutError, match=r"did not start .* within timeout=3 s: it was still"):
        with DataLoader(pipe, service, seed=0) as loader:  # was: waited the whole 1000 s
            list(loader)
    before.assert_released(timeout=10)  # the stuck template is killed, not left


def _spawn(workers: int, **kwargs) -> MultiProcessingReadingService:
    return MultiProcessingReadingService(workers, start_method="spawn", timeout=30, **kwargs)


# -- an exited worker's last message is read before its exit is reported ----------
class _QueueFilledLate:
    """Empty at the first look; then holds what the worker sent just before exiting."""

    def __init__(self, last):
        self.looks, self.last = 0, last

    def get(self, block=True):
        self.looks += 1
        if self.looks == 1 or self.last is None:
            raise NotAvailable
        last, self.last = self.last, None
        return last


class _Exited:
    label = "worker process 0 (pid 1)"

    def exit_code(self):
        return 0

    def died(self):
        return WorkerError(f"{self.label} exited with code 0 before finishing its epoch")


class _AllExited:
    workers: list = []

    def any_exited(self):
        return True


def test_a_failure_sent_just_before_the_worker_exited_is_read_not_its_exit():
    from pipeloom.reading_service.strategies.classic import process_pool
    from pipeloom.reading_service.workers.failure import capture_failure

    failure = capture_failure(RuntimeError("cannot open the table"), "worker process 0")
    channel = process_pool._ProcessChannel(  # noqa: SLF001 - the main's end of one worker
        _Exited(), _QueueFilledLate(failure), _AllExited()
    )
    assert channel.get_nowait() is failure  # was: "exited with code 0 before finishing"
    assert channel.ended
    with pytest.raises(WorkerError, match="exited with code 0"):
        channel.get_nowait()  # nothing more: now the exit is reported


def test_closing_a_template_stuck_unpickling_kills_it_after_the_grace(monkeypatch):
    import pickle

    import psutil

    from pipeloom.reading_service.workers import start_server

    monkeypatch.setattr(start_server, "_REAP_TIMEOUT", 0.5)
    monkeypatch.setenv("ATTACK_MAIN_PID", str(os.getpid()))
    data = pickle.dumps(SlowToLoad(1000.0))
    template = start_server.start_server().new_template(lambda file: file.write(data))
    assert psutil.pid_exists(template.pid)
    template.close()  # was: returned after the grace, the template left sleeping
    assert not psutil.pid_exists(template.pid) or psutil.Process(template.pid).status() == (
        psutil.STATUS_ZOMBIE
    )


STUCK_USER_JOB = """
import sys
import time

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import MultiProcessingReadingService


def _stuck(fifo):
    with open(fifo, "wb") as started:  # tells the test: the template is unpickling
        started.write(b"x")
    time.sleep(600)


class Stuck:
    def __init__(self, fifo):
        self.fifo = fifo

    def __reduce__(self):
        return _stuck, (self.fifo,)

    def __call__(self, x):
        return x


if __name__ == "__main__":
    pipe = IterableWrapper(range(4)).sharding_filter().map(Stuck(sys.argv[1]))
    next(iter(DataLoader(pipe, MultiProcessingReadingService(1, start_method="spawn"))))
"""


@pytest.mark.timeout(60)
def test_a_template_stuck_unpickling_dies_with_its_killed_user_process(tmp_path):
    """A template watches the user's process only once the pipeline is unpickled; until
    then it dies with the start server, which exits with the user's process (it was left
    sleeping in the dataset's unpickling, for good, after the user's SIGKILL)."""
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    script = tmp_path / "stuck_user_job.py"
    script.write_text(STUCK_USER_JOB)
    user = subprocess.Popen([sys.executable, str(script), str(fifo)])
    family: list[psutil.Process] = []
    try:
        with open(fifo, "rb") as started:  # until the template runs the user's unpickling
            assert started.read(1) == b"x"
        family = psutil.Process(user.pid).children(recursive=True)  # server and template
        assert len(family) >= 2
        user.kill()
        user.wait(timeout=10)
        _, alive = psutil.wait_procs(family, timeout=20)
        assert alive == []
    finally:
        user.kill()
        for process in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
