"""Attacks on the caching blocks from the outside: resumes, stale fingerprints, damaged files.

Each test is the smallest case of a silent wrong-data bug that was found and fixed.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading

import pytest

import pipeloom
from pipeloom.datapipes import IterableWrapper, fingerprint
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from pipeloom.testing import collect

pytestmark = pytest.mark.timeout(60)


def identity(x):
    return x


# -- in_memory_cache: a worker whose part of a resumed epoch is empty ------------------------
def _cached(n):
    return IterableWrapper(range(n)).sharding_filter().map(identity).in_memory_cache()


def _resumed_epochs(n, service, *, step, warm_epochs, count=2):
    """The rest of the epoch resumed after ``step`` items, then ``count`` whole epochs."""
    with pipeloom.DataLoader(_cached(n), service(), seed=1) as loader:
        for _ in range(warm_epochs):
            list(loader)
        iterator = iter(loader)
        head = [next(iterator) for _ in range(step)]
        state = loader.state_dict()
    with pipeloom.DataLoader(_cached(n), service(), seed=1) as resumed:
        resumed.load_state_dict(state)
        return [head + list(resumed)] + [list(resumed) for _ in range(count)]


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_in_memory_cache_replays_every_item_after_a_resume_in_worker_threads(workers):
    # a worker resumed past the end of its shard cached nothing, took that for its whole
    # shard, and replayed nothing in every later epoch (5 workers, 4 items: some shards empty)
    n = 4
    for warm_epochs in (0, 1):
        for step in range(n + 1):
            got = _resumed_epochs(
                n, lambda: ThreadReadingService(workers), step=step, warm_epochs=warm_epochs
            )
            for index, epoch in enumerate(got):
                assert sorted(epoch) == list(range(n)), (warm_epochs, step, index, epoch)


def test_in_memory_cache_replays_every_item_after_a_resume_in_persistent_processes():
    def service():
        return MultiProcessingReadingService(3, persistent_workers=True, start_method="fork")

    got = _resumed_epochs(7, service, step=6, warm_epochs=0)
    assert [sorted(epoch) for epoch in got] == [list(range(7))] * 3


# -- snapshot(): the fingerprint sees what the pipeline computes -----------------------------
LABELS = {0: "cat", 1: "dog"}
ALLOWED = {0, 2}


class Config:
    SCALE = 2


class Derived(Config):
    pass


def scaled(x):
    return x * Derived.SCALE  # the constant lives on a base class


class Scaler:
    OFFSET = 1

    def __call__(self, x):
        return x + self.OFFSET


def _snapshot_reads(tmp_path):
    made = IterableWrapper(range(4)).filter(ALLOWED.__contains__)
    made = made.map(LABELS.get).map(str).snapshot(tmp_path / "labels")
    return collect(made)


def test_a_snapshot_of_a_builtin_method_bound_to_data_follows_the_data(tmp_path, monkeypatch):
    # dict.get / set.__contains__ were digested by name only: changed data read a stale snapshot
    assert _snapshot_reads(tmp_path) == ["cat", "None"]
    monkeypatch.setitem(LABELS, 0, "bird")
    monkeypatch.setattr(sys.modules[__name__], "ALLOWED", {0, 1})
    with pytest.warns(UserWarning, match=r"different upstream \(#1 Mapper\(fn=dict.get\); #2"):
        assert _snapshot_reads(tmp_path) == ["bird", "dog"]


@pytest.mark.parametrize("fn", [scaled, Scaler()], ids=["function", "callable-object"])
def test_the_fingerprint_follows_class_constants_a_function_reads(fn, monkeypatch):
    before = fingerprint(IterableWrapper([1]).map(fn)).digest
    assert fingerprint(IterableWrapper([1]).map(fn)).digest == before
    monkeypatch.setattr(Config, "SCALE", 3)
    monkeypatch.setattr(Scaler, "OFFSET", 5)
    assert fingerprint(IterableWrapper([1]).map(fn)).digest != before


def test_a_bound_builtin_of_a_library_keeps_its_fingerprint():
    def digest():
        return fingerprint(IterableWrapper([1]).map(str).map(str.upper).map(len)).digest

    assert digest() == digest()


# -- on_disk_cache / end_caching: failed keys, damaged lists -----------------------------------
def _two_files(folder, fail=None):
    """Each key makes its own file, then ``<key>.extra``; ``fail(key)`` runs first."""

    def make(key):
        if fail is not None:
            fail(key)
        yield os.path.join(folder, key), key.encode()
        yield os.path.join(folder, key + ".extra"), b"extra"

    return (
        IterableWrapper(["a", "b"])
        .on_disk_cache(filepath_fn=lambda key: os.path.join(folder, key))
        .flatmap(make)
        .end_caching(timeout=2)
    )


def _truncated(key):
    raise OSError(f"the archive {key} is truncated")


def _names(pipe):
    return [os.path.basename(path) for path in collect(pipe)]


def test_a_key_that_failed_is_made_again_at_once_in_the_same_process(tmp_path):
    # the failed key's lock stayed held by the broken pipeline, so a retry in the same process
    # waited for the timeout, then blamed "another process"
    broken = _two_files(str(tmp_path), fail=_truncated)
    with pytest.raises(OSError, match="truncated"):
        collect(broken)
    assert _names(_two_files(str(tmp_path))) == ["a", "a.extra", "b", "b.extra"]
    assert broken is not None  # still alive while the retry ran


def test_an_empty_list_of_a_keys_files_makes_the_key_again(tmp_path):
    # a damaged (emptied) <key>.cached_files made the key yield no file at all, silently
    assert _names(_two_files(str(tmp_path))) == ["a", "a.extra", "b", "b.extra"]
    (tmp_path / "a.cached_files").write_text("")
    assert _names(_two_files(str(tmp_path))) == ["a", "a.extra", "b", "b.extra"]
    assert (tmp_path / "a.cached_files").read_text() != ""


# -- a key whose maker stopped after the key's own file, before the rest --------------------
# Each left the key's own file and no list, which later runs took for a single-file key:
# they yielded "a" without "a.extra", silently, for good. The key's marker now says it is
# not made yet.
EVERY_FILE = ["a", "a.extra", "b", "b.extra"]


def test_an_epoch_broken_off_inside_a_key_makes_the_key_again(tmp_path):
    with pipeloom.DataLoader(_two_files(str(tmp_path))) as loader:
        for path in loader:
            assert os.path.basename(path) == "a"
            break  # "a" written, "a.extra" not
        assert [os.path.basename(p) for p in loader] == EVERY_FILE
    assert _names(_two_files(str(tmp_path))) == EVERY_FILE
    assert not list(tmp_path.glob("*.cache_making"))


def test_a_pipeline_left_inside_a_key_neither_blocks_nor_shortens_a_new_one(tmp_path):
    left = iter(_two_files(str(tmp_path)))
    assert os.path.basename(next(left)) == "a"  # holds a's lock, in this thread, for good
    assert _names(_two_files(str(tmp_path))) == EVERY_FILE  # no wait for the 2 s timeout


def test_a_lock_left_by_a_thread_that_ended_is_taken_over(tmp_path):
    left = []

    def read_one():
        iterator = iter(_two_files(str(tmp_path)))
        left.append((iterator, next(iterator)))  # the iterator outlives the thread

    thread = threading.Thread(target=read_one)
    thread.start()
    thread.join(10)
    assert [os.path.basename(path) for _, path in left] == ["a"]
    assert _names(_two_files(str(tmp_path))) == EVERY_FILE  # no wait for the 2 s timeout


def _make_a_then_die(folder):
    def make(key):
        yield os.path.join(folder, key), key.encode()
        os.kill(os.getpid(), signal.SIGKILL)  # after the key's own file, before its sidecar

    pipe = IterableWrapper(["a"]).on_disk_cache(lambda key: os.path.join(folder, key))
    list(pipe.flatmap(make).end_caching())


def test_a_key_whose_maker_was_killed_after_its_own_file_is_made_again(tmp_path):
    maker = multiprocessing.get_context("fork").Process(
        target=_make_a_then_die, args=(str(tmp_path),)
    )
    maker.start()
    maker.join(30)
    assert maker.exitcode == -signal.SIGKILL
    assert (tmp_path / "a").exists() and not (tmp_path / "a.extra").exists()
    assert _names(_two_files(str(tmp_path))) == EVERY_FILE
