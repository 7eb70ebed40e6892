"""FSSpecFileLister / FSSpecFileOpener on fsspec's in-memory file system."""

from __future__ import annotations

import copy
import sys
import uuid

import pytest

from pipeloom.datapipes import IterableWrapper, reset_pipeline
from pipeloom.testing import check_resume_from_every_step, collect, collect_async

fsspec = pytest.importorskip("fsspec", reason="fsspec is an optional extra")

from pipeloom.datapipes import FSSpecFileLister, FSSpecFileOpener  # noqa: E402


@pytest.fixture
def root():
    fs = fsspec.filesystem("memory")
    base = f"/pl-{uuid.uuid4().hex}"
    fs.pipe(
        {
            f"{base}/b.txt": b"B1\nB2\n",
            f"{base}/a.txt": b"A1\n",
            f"{base}/c.csv": b"x,y\n",
            f"{base}/sub/d.txt": b"D1\n",
        }
    )
    yield f"memory://{base}"
    fs.rm(base, recursive=True)


def test_lists_sorted_urls_matching_masks(root):
    assert list(FSSpecFileLister(root, "*.txt")) == [
        f"memory://{root[9:]}/a.txt",
        f"memory://{root[9:]}/b.txt",
    ]
    assert [u.rsplit("/", 2)[-2:] for u in FSSpecFileLister(root, "*.txt", recursive=True)] == [
        [root.rsplit("/", 1)[-1], "a.txt"],
        [root.rsplit("/", 1)[-1], "b.txt"],
        ["sub", "d.txt"],
    ]


def test_opens_urls_in_text_and_binary_mode(root):
    files = FSSpecFileLister(root, "*.txt")
    assert collect(FSSpecFileOpener(files).readlines(return_path=False)) == ["A1", "B1", "B2"]
    binary = collect_async(FSSpecFileOpener(files, mode="rb").readlines(return_path=False))
    assert binary == [b"A1", b"B1", b"B2"]


def test_missing_root_and_empty_masks_are_reported(root):
    with pytest.raises(FileNotFoundError, match=r"root 'memory://nowhere-.*' does not exist"):
        list(FSSpecFileLister(f"memory://nowhere-{uuid.uuid4().hex}"))
    with pytest.warns(UserWarning, match=r"matches masks \['\*.parquet'\]"):
        assert list(FSSpecFileLister(root, "*.parquet")) == []


def test_resumes_mid_file(root):
    check_resume_from_every_step(
        lambda: FSSpecFileOpener(FSSpecFileLister(root, recursive=True)).readlines()
    )


def test_opener_is_shardable(root):
    pipe = FSSpecFileOpener(FSSpecFileLister(root, recursive=True)).readlines(return_path=False)
    outputs = []
    for index in range(3):
        replica = copy.deepcopy(pipe)
        replica.source.sharding_settings(3, index)
        outputs.append(collect(replica))
    assert sorted(sum(outputs, [])) == sorted(collect(pipe)) and all(outputs)


def test_streams_close_on_reset(root):
    opener = FSSpecFileOpener(FSSpecFileLister(root))
    it = iter(opener)
    streams = [next(it)[1], next(it)[1]]
    reset_pipeline(opener)
    assert all(s.closed for s in streams)


def test_missing_fsspec_raises_an_import_error_with_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(
        ImportError,
        match="FSSpecFileLister needs the optional dependency fsspec: pip install fsspec",
    ):
        FSSpecFileLister("memory://x")
    with pytest.raises(ImportError, match="pip install fsspec"):
        FSSpecFileOpener(IterableWrapper([]))


def test_bad_arguments_are_rejected():
    with pytest.raises(TypeError, match="root must be a non-empty URL string"):
        FSSpecFileLister("")
    with pytest.raises(ValueError, match="mode must be one of"):
        FSSpecFileOpener(IterableWrapper([]), mode="w")
    assert repr(FSSpecFileLister("memory://d", "*.tar")) == (
        "FSSpecFileLister(root='memory://d', masks=['*.tar'], recursive=False)"
    )
    assert (
        repr(FSSpecFileOpener(IterableWrapper([]), "rb"))
        == "FSSpecFileOpener(mode='rb', encoding=None)"
    )
