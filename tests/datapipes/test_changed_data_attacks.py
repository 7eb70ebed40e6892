"""The files under a loader change between a checkpoint and its resume, as they do on a real job.

A job checkpoints in the middle of a shard; the dataset directory is
re-synced, a shard rewritten, a file added; the job resumes days later. A
checkpoint holds positions ("file 0 of the listing, member 2 of it"), so the
resume must either continue exactly or refuse, saying what changed. It used
to go on silently:

* a file added that sorts before the current one, or one deleted or renamed,
  shifted the listing: the resumed epoch read its first samples again
  (in-process) or the new file's samples at the old offset (processes), or
  skipped a file's samples;
* the current shard rewritten, appended to or cut: the reader skipped the
  saved number of members of the *new* content and went on with it.

The state now records the listing (its length and a CRC-32 of the paths) and,
where a reader resumes inside files, each file's size and modification time,
for a FileLister, an FSSpecFileLister (size and version, e.g. an ETag) and an
IterableWrapper of a list of paths (which the fingerprint described by its
length only); ``load_state_dict`` compares them. In the calling process the
opener's state also keeps the version of each stream a reader is inside of (a
file's size and time, a URL's ETag, Last-Modified and length), checked when
the resume re-opens it. Also: the listing is taken once per loader in the
main process, so worker processes started every epoch no longer list again
(a file added after epoch 1 appeared in epoch 2 under processes only).
"""

from __future__ import annotations

import collections
import io
import os
import tarfile
import time
import uuid
import warnings
import zipfile
import zlib

import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import FileLister, FSSpecFileLister, HttpReader, IterableWrapper
from pipeloom.errors import StateError
from pipeloom.reading_service import MultiProcessingReadingService
from tests.datapipes.hostile_http import HostileServer, Route


def _processes(workers: int) -> MultiProcessingReadingService:
    return MultiProcessingReadingService(workers, start_method="fork", timeout=30)


def _tar(path, tag: str, members: int = 4) -> None:
    with tarfile.open(path, "w") as tar:
        for i in range(members):
            payload = f"{tag}{i}".encode()
            info = tarfile.TarInfo(f"s{i}.txt")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))


def _lines(path, tag: str, members: int = 4) -> None:
    path.write_text("".join(f"{tag}{i}\n" for i in range(members)))


def _zip(path, tag: str, members: int = 4) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for i in range(members):
            archive.writestr(f"s{i}.txt", f"{tag}{i}")


FORMATS = {
    "tar": (
        "tar",
        _tar,
        lambda files: files.open_files("rb").load_from_tar().map(lambda x: x[1].decode()),
    ),
    "lines": ("txt", _lines, lambda files: files.open_files("r").readlines().map(lambda x: x[1])),
    "zip": (
        "zip",
        _zip,
        lambda files: files.open_files("rb").load_from_zip().map(lambda x: x[1].read().decode()),
    ),
}


def _build(root, kind: str = "tar"):
    extension, _, read = FORMATS[kind]
    return read(FileLister(str(root), f"*.{extension}").sharding_filter())


def _checkpoint(root, kind: str = "tar", service=None, taken: int = 2):
    """Two files b and c; the state after ``taken`` items (inside b)."""
    extension, write, _ = FORMATS[kind]
    write(root / f"b.{extension}", "B")
    write(root / f"c.{extension}", "C")
    with DataLoader(_build(root, kind), service, seed=0) as loader:
        iterator = iter(loader)
        seen = [next(iterator) for _ in range(taken)]
        return seen, loader.state_dict()


def _resume(root, state, kind: str = "tar", service=None, **load):
    with DataLoader(_build(root, kind), service, seed=0) as loader:
        loader.load_state_dict(state, **load)
        return list(loader)


def _later(path) -> None:
    """The file was rewritten later than it was first written (days later, on a real job)."""
    status = os.stat(path)
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 10**9))


def _rewrite_same_size(root):
    _tar(root / "b.tar", "X")
    _later(root / "b.tar")


def _append(root):
    _tar(root / "b.tar", "B", members=6)


def _truncate(root):
    with open(root / "b.tar", "r+b") as file:
        file.truncate(os.path.getsize(root / "b.tar") - 1024)  # the end-of-archive blocks


def _replace(root):
    os.remove(root / "b.tar")
    _tar(root / "b.tar.partial", "Y", members=3)
    os.rename(root / "b.tar.partial", root / "b.tar")  # as rsync does


CONTENT = {
    "rewritten, same size": _rewrite_same_size,
    "appended to": _append,
    "truncated": _truncate,
    "replaced by another size": _replace,
}
LISTING = {
    "deleted": lambda root: os.remove(root / "b.tar"),
    "a file added before it": lambda root: _tar(root / "a.tar", "A"),
    "renamed": lambda root: os.rename(root / "b.tar", root / "b2.tar"),
}


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_an_unchanged_directory_resumes_exactly_mid_file(tmp_path, kind):
    seen, state = _checkpoint(tmp_path, kind)
    expected = [f"{letter}{i}" for letter in "BC" for i in range(4)]
    assert seen + _resume(tmp_path, state, kind) == expected


@pytest.mark.parametrize("change", sorted(CONTENT))
def test_a_shard_changed_under_a_mid_shard_checkpoint_is_refused_naming_it(tmp_path, change):
    _, state = _checkpoint(tmp_path)
    CONTENT[change](tmp_path)
    with pytest.raises(StateError) as caught:
        _resume(tmp_path, state)
    message = str(caught.value)
    assert "1 of 2 file(s) were rewritten, appended to or cut" in message, message
    assert repr(str(tmp_path / "b.tar")) in message
    assert "loader.set_epoch(0)" in message and "strict=False" in message


@pytest.mark.parametrize("change", sorted(LISTING))
def test_a_listing_changed_under_a_mid_shard_checkpoint_is_refused(tmp_path, change):
    _, state = _checkpoint(tmp_path)
    LISTING[change](tmp_path)
    with pytest.raises(
        StateError, match=r"block #\d FileLister: listed 2 path\(s\), CRC-32 .* now"
    ):
        _resume(tmp_path, state)


@pytest.mark.parametrize("kind", ["lines", "zip"])
def test_other_mid_file_readers_refuse_a_rewritten_file(tmp_path, kind):
    _, state = _checkpoint(tmp_path, kind)
    extension, write, _ = FORMATS[kind]
    write(tmp_path / f"b.{extension}", "X")
    _later(tmp_path / f"b.{extension}")
    with pytest.raises(StateError, match="1 of 2 file"):
        _resume(tmp_path, state, kind)


def test_processes_refuse_as_in_process_and_resume_exactly_on_another_worker_count(tmp_path):
    # Under worker processes the resume is by position: a file added before the
    # current one gave its samples at the old offset ('A2', 'A3', ...), a deleted
    # one skipped the next file's first samples.
    seen, state = _checkpoint(tmp_path, service=_processes(2))
    assert seen + _resume(tmp_path, state, service=_processes(1)) == [
        f"{letter}{i}" for letter in "BC" for i in range(4)
    ]
    _tar(tmp_path / "a.tar", "A")
    with pytest.raises(StateError, match="listed 2 path"):
        _resume(tmp_path, state, service=_processes(1))
    os.remove(tmp_path / "a.tar")
    _append(tmp_path)
    with pytest.raises(StateError, match="1 of 2 file"):
        _resume(tmp_path, state, service=_processes(1))


def test_strict_false_resumes_at_the_saved_position_of_the_changed_files(tmp_path):
    _, state = _checkpoint(tmp_path)
    _rewrite_same_size(tmp_path)
    assert _resume(tmp_path, state, strict=False) == ["X2", "X3", "C0", "C1", "C2", "C3"]


def test_a_state_between_epochs_loads_over_changed_files(tmp_path):
    # No position points into the files: the next epoch lists them as they are now.
    _tar(tmp_path / "b.tar", "B")
    with DataLoader(_build(tmp_path), seed=0) as loader:
        list(loader)
        state = loader.state_dict()
    assert state["fingerprint"]["data"] == []
    _tar(tmp_path / "a.tar", "A", members=1)
    assert _resume(tmp_path, state) == ["A0", "B0", "B1", "B2", "B3"]


def test_a_whole_file_pipeline_records_the_listing_without_a_stat_per_file(tmp_path):
    _tar(tmp_path / "b.tar", "B")
    pipe = FileLister(str(tmp_path), "*.tar").sharding_filter().open_files("rb")
    with DataLoader(pipe.map(lambda x: x[1].read()), seed=0) as loader:
        next(iter(loader))
        [[label, recorded]] = loader.state_dict()["fingerprint"]["data"]
    assert label.endswith("FileLister") and list(recorded) == ["listing"]


def test_worker_processes_started_every_epoch_keep_the_first_listing(tmp_path):
    # The listing is kept for every epoch (docs/storage.md): in-process, in threads and in
    # persistent workers it was; fresh worker processes listed again each epoch.
    _tar(tmp_path / "b.tar", "B", members=2)
    with DataLoader(_build(tmp_path), _processes(2), seed=0) as loader:
        first = list(loader)
        _tar(tmp_path / "a.tar", "A", members=2)
        assert list(loader) == first == ["B0", "B1"]


# -- paths that no lister lists, and URLs: the stream being read is checked when it is re-opened


def _paths_pipe(paths):
    return IterableWrapper(paths).open_files("rb").load_from_tar().map(lambda x: x[1].decode())


def test_a_file_from_paths_no_list_holds_is_checked_when_the_resume_reopens_it(tmp_path):
    # A deque: the loader's state records no listing of it, the opener's state does.
    paths = collections.deque([str(tmp_path / "b.tar"), str(tmp_path / "c.tar")])
    _tar(paths[0], "B")
    _tar(paths[1], "C")
    with DataLoader(_paths_pipe(paths), seed=0) as loader:
        iterator = iter(loader)
        seen = [next(iterator) for _ in range(2)]
        state = loader.state_dict()
    assert seen + _resume_pipe(_paths_pipe(paths), state) == [
        f"{letter}{i}" for letter in "BC" for i in range(4)
    ]
    _rewrite_same_size(tmp_path)
    with pytest.raises(StateError, match=r"b\.tar' changed since the checkpoint was saved"):
        _resume_pipe(_paths_pipe(paths), state)


def _resume_pipe(pipe, state):
    with DataLoader(pipe, seed=0) as loader:
        loader.load_state_dict(state)
        return list(loader)


def _http_pipe(server):
    return HttpReader(IterableWrapper([server.url("/b.tar")]), backoff=0.01, timeout=5)


@pytest.mark.timeout(30)
def test_a_url_whose_file_changed_on_the_server_since_the_checkpoint_is_refused():
    first, second = io.BytesIO(), io.BytesIO()
    _tar_to(first, "B")
    _tar_to(second, "X")  # the same size: only the ETag tells them apart
    assert len(first.getvalue()) == len(second.getvalue())
    with HostileServer() as server:
        server.routes["/b.tar"] = Route(versions=[first.getvalue(), second.getvalue()])
        pipe = _http_pipe(server).load_from_tar().map(lambda x: x[1].decode())
        with DataLoader(pipe, seed=0) as loader:
            iterator = iter(loader)
            seen = [next(iterator) for _ in range(2)]
            state = loader.state_dict()
        assert seen == ["B0", "B1"]
        pipe = _http_pipe(server).load_from_tar().map(lambda x: x[1].decode())
        with pytest.raises(StateError, match=r"changed since the checkpoint .*ETag \"v0\""):
            _resume_pipe(pipe, state)


def _tar_to(buffer, tag: str) -> None:
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for i in range(4):
            payload = f"{tag}{i}".encode()
            info = tarfile.TarInfo(f"s{i}.txt")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))


def test_a_list_of_paths_is_checked_as_a_listing_under_worker_processes(tmp_path):
    # Under workers the resume goes by position, not through the opener's state: a list
    # whose paths were reordered (same length) or whose file was rewritten resumed silently.
    paths = [str(tmp_path / name) for name in ("b.tar", "c.tar", *(f"d{i}.tar" for i in range(7)))]
    for path in paths:  # more than 8: the pipeline's fingerprint says "list of 9 items"
        _tar(path, os.path.basename(path)[0].upper())
    with DataLoader(_paths_pipe(paths), _processes(2), seed=0) as loader:
        iterator = iter(loader)
        [next(iterator) for _ in range(2)]
        state = loader.state_dict()
    with pytest.raises(StateError, match=r"held 9 string\(s\), .*reordered"):
        _resume_pipe(_paths_pipe([paths[1], paths[0], *paths[2:]]), state)
    _rewrite_same_size(tmp_path)
    with pytest.raises(StateError, match=r"1 of 9 file\(s\) were rewritten.*b\.tar"):
        _resume_pipe(_paths_pipe(paths), state)


def test_an_fsspec_file_rewritten_under_a_mid_file_checkpoint_is_refused_under_processes():
    # FSSpecFileLister's state recorded the listing only: a shard rewritten on the
    # file system (the same size, a new version) was resumed inside, silently.
    fsspec = pytest.importorskip("fsspec", reason="fsspec is an optional extra")
    fs = fsspec.filesystem("memory")
    base = f"/pl-{uuid.uuid4().hex}"
    for name, tag in (("b", "B"), ("c", "C")):
        buffer = io.BytesIO()
        _tar_to(buffer, tag)
        fs.pipe_file(f"{base}/{name}.tar", buffer.getvalue())

    def build():
        files = FSSpecFileLister(f"memory://{base}", "*.tar").sharding_filter()
        return files.open_files_by_fsspec("rb").load_from_tar().map(lambda x: x[1].decode())

    try:
        with DataLoader(build(), _processes(2), seed=0) as loader:
            iterator = iter(loader)
            [next(iterator) for _ in range(2)]
            state = loader.state_dict()
        buffer = io.BytesIO()
        _tar_to(buffer, "X")
        fs.pipe_file(f"{base}/b.tar", buffer.getvalue())
        with pytest.raises(StateError, match=r"1 of 2 file\(s\) were rewritten.*b\.tar"):
            _resume_pipe(build(), state)
    finally:
        fs.rm(base, recursive=True)


def test_a_list_of_urls_is_hashed_once_not_at_every_state_dict(monkeypatch):
    # Hashing 1M URLs costs ~110 ms: a loader saving its state at every step must not pay
    # it each time. A list that grows is hashed again, and the resume still compares.
    hashed = []
    crc32 = zlib.crc32

    def counting(data, *rest):
        if b"127.0.0.1:9/shard-0.tar" in bytes(data):  # this test's list, hashed whole
            hashed.append(1)
        return crc32(data, *rest)

    monkeypatch.setattr(zlib, "crc32", counting)
    urls = [f"http://127.0.0.1:9/shard-{i}.tar" for i in range(40)]
    with DataLoader(IterableWrapper(urls).sharding_filter().batch(4)) as loader:
        iterator = iter(loader)
        next(iterator)
        states = [loader.state_dict() for _ in range(5)]
        assert len(hashed) == 1
        urls.append("http://127.0.0.1:9/shard-40.tar")  # the list the loader reads grew
        grown = loader.state_dict()
        assert len(hashed) == 2
    assert states[0]["fingerprint"]["data"] == states[-1]["fingerprint"]["data"]
    assert grown["fingerprint"]["data"] != states[0]["fingerprint"]["data"]
    with DataLoader(IterableWrapper(urls[:40]).sharding_filter().batch(4)) as loader:
        loader.load_state_dict(states[0])  # the same 40 URLs: resumes
        with pytest.raises(StateError, match="41 string"):
            loader.load_state_dict(grown)


def _roots(tmp_path) -> list[str]:
    roots = [str(tmp_path / "a"), str(tmp_path / "b")]
    for root in roots:
        os.mkdir(root)
        for name in ("1.bin", "2.bin"):
            open(os.path.join(root, name), "wb").close()
    return roots


def _inside_and_between(make):
    """A state after the first item, and one after the epoch."""
    with DataLoader(make(), seed=0) as loader:
        iterator = iter(loader)
        first = next(iterator)
        inside = loader.state_dict()
        rest = list(iterator)
        return inside, loader.state_dict(), [first, *rest]


@pytest.mark.parametrize("order", ["as listed", "shuffled and sharded"])
def test_list_files_over_a_list_of_roots_is_checked_as_a_file_lister_of_them(tmp_path, order):
    # The roots came through IterableWrapper, so no listing was recorded: with a file
    # added under the root being read, the resume read a file twice (under workers: the
    # root was listed again and the files read before dropped by count), or gave a removed
    # file's path (in-process), silently.
    roots = _roots(tmp_path)

    def make():
        source = IterableWrapper(roots)
        if order != "as listed":
            source = source.shuffle().sharding_filter()
        return source.list_files()

    inside, _, epoch = _inside_and_between(make)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # checked: no warning that it cannot be
        with DataLoader(make(), seed=0) as loader:
            loader.load_state_dict(inside)
            assert [epoch[0], *loader] == epoch
    open(os.path.join(roots[0], "0.bin"), "wb").close()
    with pytest.raises(StateError, match=r"RootLister: listed 4 path.*now 5 path.*added, rem"):
        DataLoader(make(), seed=0).load_state_dict(inside)
    # A file added between two epochs is read by the next one (the roots are listed as
    # they arrive): a state taken in it records it and resumes.
    with DataLoader(make(), seed=0) as loader:
        list(loader)
        open(os.path.join(roots[1], "9.bin"), "wb").close()
        iterator = iter(loader)
        next(iterator)
        inside = loader.state_dict()
        epoch = [*iterator]
    assert any(path.endswith("9.bin") for path in epoch)
    with DataLoader(make(), seed=0) as loader:
        loader.load_state_dict(inside)
        assert list(loader) == epoch


def test_a_resume_over_list_files_of_a_stream_of_roots_says_it_cannot_check_them(tmp_path):
    # Roots a block makes (here a map) cannot be listed when the state is taken, and
    # strict=True loaded the state as though it had checked their files.
    roots = _roots(tmp_path)
    inside, between, _ = _inside_and_between(lambda: IterableWrapper(roots).map(str).list_files())
    loader = DataLoader(IterableWrapper(roots).map(str).list_files(), seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader.load_state_dict(inside)
        loader.load_state_dict(inside, strict=False)
        loader.load_state_dict(between)  # points into no file
    [message] = [str(w.message) for w in caught]
    assert "block #0 RootLister: lists the files under each root as the root arrives" in message
    assert "FileLister([root, ...])" in message
    fsspec = pytest.importorskip("fsspec")
    url = f"memory://{uuid.uuid4().hex}"
    fsspec.filesystem("memory").pipe({f"{url}/a/1.bin": b"", f"{url}/a/2.bin": b""})
    inside, _, _ = _inside_and_between(lambda: IterableWrapper([f"{url}/a"]).list_files_by_fsspec())
    with pytest.warns(UserWarning, match=r"block #0 FSSpecRootLister: lists the files"):
        DataLoader(IterableWrapper([f"{url}/a"]).list_files_by_fsspec()).load_state_dict(inside)


def test_a_listing_kept_between_checkpoints_still_sees_a_file_added_or_removed(tmp_path):
    # Each state_dict() listed every root again (75 ms at 50,000 files); the listing is
    # now kept while no root changed, which must not hide a change made after it.
    roots = _roots(tmp_path)
    settled = time.time() - 60
    for root in roots:
        os.utime(root, (settled, settled))  # changed a minute ago: the listing is kept
    with DataLoader(IterableWrapper(roots).list_files(), seed=0) as loader:
        iterator = iter(loader)
        next(iterator)
        first = loader.state_dict()
        assert loader.state_dict()["fingerprint"]["data"] == first["fingerprint"]["data"]
        open(os.path.join(roots[1], "9.bin"), "wb").close()
        added = loader.state_dict()
        os.remove(os.path.join(roots[1], "9.bin"))
        removed = loader.state_dict()
    assert added["fingerprint"]["data"] != first["fingerprint"]["data"]
    assert removed["fingerprint"]["data"] == first["fingerprint"]["data"]
    with pytest.raises(StateError, match=r"RootLister: listed 5 path.*now 4 path"):
        DataLoader(IterableWrapper(roots).list_files(), seed=0).load_state_dict(added)
