"""on_disk_cache / end_caching: download once, read from disk after; atomic, locked, in order."""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import signal
import tarfile
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import pipeloom
from pipeloom.datapipes import EndOnDiskCacheHolder, HttpReader, IterableWrapper, OnDiskCacheHolder
from pipeloom.datapipes._cache_files import FileLock
from pipeloom.datapipes._on_disk_cache import LIST_SUFFIX
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from pipeloom.testing import check_resume_from_every_step, collect

FILES = {f"/f{i}.bin": bytes([i]) * (1000 + 37 * i) for i in range(6)}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        server = self.server
        with server.lock:
            server.hits[self.path] = server.hits.get(self.path, 0) + 1
        body = server.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path == server.stall_path:  # half the body, then hang until released
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            server.stalled.set()
            server.release.wait(30)
            return
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.files = dict(FILES)
    httpd.hits, httpd.lock = {}, threading.Lock()
    httpd.stall_path, httpd.stalled, httpd.release = None, threading.Event(), threading.Event()
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    httpd.base = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield httpd
    httpd.release.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join(10)


def urls(server, names=FILES):
    return [server.base + name for name in names]


class InFolder:
    """filepath_fn: the URL's file name inside ``folder`` (picklable, fingerprint-free)."""

    def __init__(self, folder):
        self.folder = str(folder)

    def __call__(self, url):
        return os.path.join(self.folder, url.rsplit("/", 1)[-1])


def fetch(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return url, response.read()


def http_cache(server, folder, *, sharded=False, **end):
    keys = IterableWrapper(urls(server))
    if sharded:
        keys = keys.sharding_filter()
    cached = keys.on_disk_cache(filepath_fn=InFolder(folder))
    return HttpReader(cached, timeout=10).end_caching(mode="wb", same_filepath_fn=True, **end)


def expected_paths(folder, names=FILES):
    return [os.path.join(folder, name.lstrip("/")) for name in names]


def test_downloads_once_then_reads_from_disk_in_key_order(server, tmp_path):
    pipe = http_cache(server, tmp_path)
    assert collect(pipe) == expected_paths(tmp_path)
    assert collect(pipe) == expected_paths(tmp_path)
    assert server.hits == {name: 1 for name in FILES}
    for name, body in FILES.items():
        assert (tmp_path / name.lstrip("/")).read_bytes() == body


def test_a_second_loader_makes_no_request(server, tmp_path):
    with pipeloom.DataLoader(http_cache(server, tmp_path), seed=0) as loader:
        first = list(loader)
    with pipeloom.DataLoader(http_cache(server, tmp_path), seed=0) as loader:
        assert list(loader) == first == expected_paths(tmp_path)
        assert list(loader) == first
    assert server.hits == {name: 1 for name in FILES}


def test_cached_and_fetched_keys_come_out_in_key_order(server, tmp_path):
    for name in list(FILES)[::2]:  # every other file already cached
        (tmp_path / name.lstrip("/")).write_bytes(FILES[name])
    assert collect(http_cache(server, tmp_path)) == expected_paths(tmp_path)
    assert set(server.hits) == set(list(FILES)[1::2])


def test_a_local_fetching_map_works_as_the_maker(server, tmp_path):
    pipe = (
        IterableWrapper(urls(server))
        .on_disk_cache(filepath_fn=InFolder(tmp_path))
        .map(fetch)
        .end_caching(mode="wb", same_filepath_fn=True, skip_read=True)
    )
    assert collect(pipe) == expected_paths(tmp_path) == collect(pipe)
    assert server.hits == {name: 1 for name in FILES}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "service",
    [ThreadReadingService(2), MultiProcessingReadingService(2)],
    ids=["threads", "processes"],
)
def test_same_paths_under_workers_and_no_request_the_second_time(server, tmp_path, service):
    reference = expected_paths(tmp_path)
    with pipeloom.DataLoader(http_cache(server, tmp_path, sharded=True), service, seed=0) as loader:
        assert list(loader) == reference
        assert list(loader) == reference
    with pipeloom.DataLoader(http_cache(server, tmp_path, sharded=True), service, seed=0) as loader:
        assert list(loader) == reference
    assert server.hits == {name: 1 for name in FILES}


@pytest.mark.timeout(120)
def test_without_sharding_filter_the_keys_are_split_at_on_disk_cache(server, tmp_path):
    for name in list(FILES)[::3]:
        (tmp_path / name.lstrip("/")).write_bytes(FILES[name])
    service = MultiProcessingReadingService(2)
    with pipeloom.DataLoader(http_cache(server, tmp_path), service, seed=0) as loader:
        assert list(loader) == expected_paths(tmp_path)
    assert server.hits == {name: 1 for name in list(FILES) if name not in list(FILES)[::3]}


def test_resume_from_every_step_while_downloading(server, tmp_path):
    def build():
        for name in os.listdir(tmp_path):
            os.unlink(tmp_path / name)
        for name in list(FILES)[1::3]:
            (tmp_path / name.lstrip("/")).write_bytes(FILES[name])
        return http_cache(server, tmp_path)

    check_resume_from_every_step(build)


def test_resume_from_every_step_when_cached(server, tmp_path):
    collect(http_cache(server, tmp_path))
    check_resume_from_every_step(lambda: http_cache(server, tmp_path))


def test_hash_mismatch_of_a_cached_file_fetches_it_again(server, tmp_path):
    hashes = {
        p: hashlib.sha256(b).hexdigest() for p, b in zip(expected_paths(tmp_path), FILES.values())
    }
    (tmp_path / "f0.bin").write_bytes(b"tampered")
    (tmp_path / "f1.bin").write_bytes(FILES["/f1.bin"])
    pipe = (
        IterableWrapper(urls(server))
        .on_disk_cache(filepath_fn=InFolder(tmp_path), hash_dict=hashes)
        .map(fetch)
        .end_caching(same_filepath_fn=True)
    )
    with pytest.warns(UserWarning, match=r"f0\.bin has sha256 .* making it again"):
        assert collect(pipe) == expected_paths(tmp_path)
    assert (tmp_path / "f0.bin").read_bytes() == FILES["/f0.bin"]
    assert "/f1.bin" not in server.hits and server.hits["/f0.bin"] == 1


def test_hash_mismatch_of_downloaded_data_raises_and_writes_nothing(server, tmp_path):
    hashes = {p: hashlib.md5(b"other").hexdigest() for p in expected_paths(tmp_path)}
    pipe = (
        IterableWrapper(urls(server))
        .on_disk_cache(filepath_fn=InFolder(tmp_path), hash_dict=hashes, hash_type="md5")
        .map(fetch)
        .end_caching(same_filepath_fn=True)
    )
    with pytest.raises(RuntimeError, match=r"the md5 of the data for .*f0\.bin is .* expected"):
        collect(pipe)
    assert os.listdir(tmp_path) == []


def test_extra_check_false_makes_the_file_again(server, tmp_path):
    (tmp_path / "f2.bin").write_bytes(b"old")
    pipe = (
        IterableWrapper(urls(server))
        .on_disk_cache(
            filepath_fn=InFolder(tmp_path), extra_check_fn=lambda p: os.path.getsize(p) > 10
        )
        .map(fetch)
        .end_caching(same_filepath_fn=True)
    )
    collect(pipe)
    assert (tmp_path / "f2.bin").read_bytes() == FILES["/f2.bin"]


def tar_of(members):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class Extracted:
    def __init__(self, folder):
        self.folder = str(folder)

    def __call__(self, member_path):
        return os.path.join(self.folder, "out", os.path.basename(member_path))


def extraction(tmp_path, opened):
    archives = IterableWrapper(sorted(str(p) for p in tmp_path.glob("*.tar")))
    cached = archives.on_disk_cache(filepath_fn=lambda p: p + ".extracted")
    members = cached.map(lambda p: opened.append(p) or p).open_files("rb").load_from_tar()
    return members.end_caching(mode="wb", filepath_fn=Extracted(tmp_path))


def test_one_archive_many_files_are_listed_and_reused(tmp_path):
    (tmp_path / "a.tar").write_bytes(tar_of([("x1", b"1"), ("x2", b"22")]))
    (tmp_path / "b.tar").write_bytes(tar_of([("y1", b"333")]))
    opened = []
    first = collect(extraction(tmp_path, opened))
    names = [os.path.basename(p) for p in first]
    assert names == ["x1", "x2", "y1"] and len(opened) == 2
    assert (tmp_path / ("a.tar.extracted" + LIST_SUFFIX)).exists()
    opened.clear()
    assert collect(extraction(tmp_path, opened)) == first and opened == []
    assert (tmp_path / "out" / "x2").read_bytes() == b"22"


def test_a_half_extracted_archive_is_extracted_again(tmp_path):
    (tmp_path / "a.tar").write_bytes(tar_of([("x1", b"1"), ("x2", b"22")]))
    opened = []
    first = collect(extraction(tmp_path, opened))
    os.unlink(first[1])  # one extracted file lost
    opened.clear()
    assert collect(extraction(tmp_path, opened)) == first and len(opened) == 1


def run_cache(base, folder, ready):
    pipe = (
        IterableWrapper([base + name for name in FILES])
        .on_disk_cache(filepath_fn=InFolder(folder))
        .map(fetch)
        .end_caching(same_filepath_fn=True)
    )
    ready.wait(30)
    list(pipe)


@pytest.mark.timeout(120)
def test_concurrent_processes_fetch_each_file_once_and_never_corrupt_it(server, tmp_path):
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    jobs = [
        context.Process(target=run_cache, args=(server.base, str(tmp_path), ready))
        for _ in range(3)
    ]
    for job in jobs:
        job.start()
    ready.set()
    for job in jobs:
        job.join(60)
        assert job.exitcode == 0
    assert server.hits == {name: 1 for name in FILES}
    for name, body in FILES.items():
        assert (tmp_path / name.lstrip("/")).read_bytes() == body
    assert sorted(os.listdir(tmp_path)) == sorted(name.lstrip("/") for name in FILES)


def download_all(base, folder):
    list(
        IterableWrapper([base + name for name in FILES])
        .on_disk_cache(filepath_fn=InFolder(folder))
        .map(fetch)
        .end_caching(same_filepath_fn=True)
    )


@pytest.mark.timeout(120)
def test_a_writer_killed_mid_download_leaves_no_file_a_later_run_trusts(server, tmp_path):
    server.stall_path = "/f3.bin"
    context = multiprocessing.get_context("fork")
    job = context.Process(target=download_all, args=(server.base, str(tmp_path)))
    job.start()
    assert server.stalled.wait(60)
    os.kill(job.pid, signal.SIGKILL)
    job.join(30)
    assert not (tmp_path / "f3.bin").exists()
    server.stall_path = None
    server.release.set()
    assert collect(http_cache(server, tmp_path)) == expected_paths(tmp_path)
    assert (tmp_path / "f3.bin").read_bytes() == FILES["/f3.bin"]
    assert server.hits["/f3.bin"] == 2 and server.hits["/f0.bin"] == 1


def test_waiting_for_another_writer_times_out_with_a_clear_error(server, tmp_path):
    # another writer: a thread that goes on running (a lock of the calling thread's own,
    # or of a thread that ended, is taken over: test_cache_attacks)
    held, release = threading.Event(), threading.Event()

    def writer():
        lock = FileLock(str(tmp_path / "f0.bin"))
        lock.acquire(timeout=5)
        held.set()
        release.wait(30)
        lock.release()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert held.wait(10)
        with pytest.raises(TimeoutError, match=r"another process has been writing .*f0\.bin"):
            collect(http_cache(server, tmp_path, timeout=0.2))
    finally:
        release.set()
        thread.join(10)
    assert collect(http_cache(server, tmp_path)) == expected_paths(tmp_path)


def test_a_lock_freed_by_its_holder_lets_the_waiter_in(tmp_path):
    held = FileLock(str(tmp_path / "x"))
    held.acquire(timeout=5)
    waiter = FileLock(str(tmp_path / "x"))
    got = threading.Event()
    thread = threading.Thread(target=lambda: (waiter.acquire(timeout=30), got.set()))
    thread.start()
    assert not got.is_set()
    held.release()
    thread.join(30)
    assert got.is_set() and waiter.held
    waiter.release()


# -- bad arguments ------------------------------------------------------------------
def test_end_caching_without_on_disk_cache_says_how_to_fix():
    with pytest.raises(ValueError, match=r"needs an \.on_disk_cache\(\.\.\.\) upstream"):
        IterableWrapper([("a", b"")]).end_caching()


def test_end_caching_twice_is_refused(tmp_path):
    cached = IterableWrapper(["a"]).on_disk_cache(filepath_fn=InFolder(tmp_path))
    cached.map(fetch).end_caching()
    with pytest.raises(ValueError, match=r"already has its end_caching\(\)"):
        cached.map(fetch).end_caching()


def test_iterating_without_end_caching_is_a_lifecycle_error(tmp_path):
    with pytest.raises(RuntimeError, match=r"without \.end_caching\(\)"):
        list(IterableWrapper(["a"]).on_disk_cache(filepath_fn=InFolder(tmp_path)))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"mode": "rb"}, ValueError, r"mode must be 'wb' \(bytes\) or 'w' \(text\), got 'rb'"),
        ({"timeout": 0}, ValueError, r"timeout must be a number of seconds > 0 or None, got 0"),
        (
            {"filepath_fn": str, "same_filepath_fn": True},
            ValueError,
            r"pass only one",
        ),
    ],
)
def test_bad_end_caching_arguments(tmp_path, kwargs, error, message):
    cached = IterableWrapper(["a"]).on_disk_cache(filepath_fn=InFolder(tmp_path))
    with pytest.raises(error, match=message):
        EndOnDiskCacheHolder(cached.map(fetch), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"hash_type": "sha1"}, ValueError, r"hash_type must be 'sha256' or 'md5', got 'sha1'"),
        ({"hash_dict": {"a": 1}}, TypeError, r"hash_dict must be a dict of path -> hex digest"),
        ({"filepath_fn": "x"}, TypeError, r"filepath_fn must be callable or None, got str"),
    ],
)
def test_bad_on_disk_cache_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        OnDiskCacheHolder(IterableWrapper(["a"]), **kwargs)


def test_a_block_that_is_not_per_key_in_between_is_refused(tmp_path):
    cached = IterableWrapper(["a"]).on_disk_cache(filepath_fn=InFolder(tmp_path))
    with pytest.raises(ValueError, match=r"must work key by key .* Shuffler"):
        cached.shuffle().map(fetch).end_caching()


def test_items_that_are_not_pairs_name_the_fix(tmp_path):
    pipe = (
        IterableWrapper(["a"]).on_disk_cache(filepath_fn=InFolder(tmp_path)).map(str).end_caching()
    )
    with pytest.raises(
        TypeError, match=r"expects \(metadata, data\) pairs such as \(url, stream\)"
    ):
        list(pipe)


def test_text_data_in_binary_mode_names_the_mode_to_use(tmp_path):
    pipe = (
        IterableWrapper(["a"])
        .on_disk_cache(filepath_fn=InFolder(tmp_path))
        .map(lambda k: (k, "text"))
        .end_caching(mode="wb", same_filepath_fn=True)
    )
    with pytest.raises(TypeError, match=r"got str data for .*; use mode='w' for str"):
        list(pipe)
    assert os.listdir(tmp_path) == []


def test_a_key_that_is_not_a_path_asks_for_filepath_fn():
    pipe = IterableWrapper([3]).on_disk_cache().map(lambda k: (k, b"")).end_caching()
    with pytest.raises(
        TypeError, match=r"needs a path \(str\) for each item, got int 3; pass filepath_fn"
    ):
        list(pipe)


def test_a_many_file_key_is_listed_before_its_lock_is_let_go(tmp_path):
    # Another process waiting on the lock must not find the key's own path alone (and take
    # it for a single-file key): the list is written as the next key is asked for.
    seen = []

    def keys():
        yield "a"
        listed = os.path.exists(os.path.join(tmp_path, "a" + LIST_SUFFIX))
        lock = FileLock(os.path.join(tmp_path, "a"))
        lock.acquire(1)  # let go: another process could take it now
        lock.release()
        seen.append(listed)
        yield "b"

    def files(key):  # the key's own path, then a sidecar
        return [(key, key.encode()), (key + ".json", b"{}")]

    pipe = (
        IterableWrapper(keys())
        .on_disk_cache(filepath_fn=InFolder(tmp_path))
        .flatmap(files)
        .end_caching(filepath_fn=InFolder(tmp_path))
    )
    assert [os.path.basename(p) for p in collect(pipe)] == ["a", "a.json", "b", "b.json"]
    assert seen == [True]


def test_a_block_reading_ahead_between_still_lists_every_file_of_a_key(tmp_path):
    def files(key):
        return [(key, key.encode()), (key + ".json", b"{}"), (key + ".txt", b"")]

    def pipe():
        return (
            IterableWrapper(["a", "b", "c"])
            .on_disk_cache(filepath_fn=InFolder(tmp_path))
            .flatmap(files)
            .threadpool_map(tuple, scheduled_tasks=2)  # asks for files ahead of its outputs
            .end_caching(filepath_fn=InFolder(tmp_path))
        )

    first = collect(pipe())
    assert len(first) == 9 and collect(pipe()) == first
    for key in "abc":
        listed = (tmp_path / (key + LIST_SUFFIX)).read_text().split("\n")
        assert [os.path.basename(p) for p in listed] == [key, key + ".json", key + ".txt"]
