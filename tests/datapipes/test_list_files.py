"""RootLister (list_files): the files under each root of a stream."""

from __future__ import annotations

import os

import pytest

from pipeloom.datapipes import FileLister, IterableWrapper, RootLister
from pipeloom.testing import check_resume_from_every_step, collect
from tests.datapipes.everywhere import check_same_output_everywhere


@pytest.fixture
def roots(tmp_path):
    made = []
    for index, names in enumerate([["b.txt", "a.txt", "c.bin"], ["z.txt"], [], ["sub/d.txt"]]):
        root = tmp_path / f"root{index}"
        root.mkdir()
        for name in names:
            (root / name).parent.mkdir(exist_ok=True)
            (root / name).write_text(name)
        made.append(str(root))
    return made


def _names(paths, base):
    return [os.path.relpath(p, base) for p in paths]


def test_lists_each_root_in_order_sorted_within_it(roots, tmp_path):
    listed = collect(IterableWrapper(roots).list_files(masks="*.txt"))
    assert _names(listed, tmp_path) == ["root0/a.txt", "root0/b.txt", "root1/z.txt"]
    recursive = collect(IterableWrapper(roots).list_files(["*.txt", "*.bin"], recursive=True))
    assert _names(recursive, tmp_path) == [
        "root0/a.txt",
        "root0/b.txt",
        "root0/c.bin",
        "root1/z.txt",
        "root3/sub/d.txt",
    ]


def test_matches_file_lister_per_root_and_takes_files_as_roots(roots):
    for root in roots[:2] + roots[3:]:  # FileLister warns about the empty root
        expected = list(FileLister(root, "*.txt", recursive=True, abspath=True))
        got = list(IterableWrapper([root]).list_files("*.txt", recursive=True, abspath=True))
        assert got == expected and all(os.path.isabs(p) for p in got)
    a_file = os.path.join(roots[0], "a.txt")
    assert list(IterableWrapper([a_file]).list_files()) == [a_file]
    assert list(IterableWrapper([a_file]).list_files("*.bin")) == []


def test_errors_name_the_problem(roots, tmp_path):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="root .*nowhere' does not exist"):
        list(IterableWrapper([missing]).list_files())
    with pytest.raises(TypeError, match=r"list_files\(\) expects root paths \(str\), got int 3"):
        list(IterableWrapper([3]).list_files())
    with pytest.raises(TypeError, match="masks must be a str or a list of str"):
        IterableWrapper(roots).list_files(masks=3)
    with pytest.raises(ValueError, match="length must be an int >= 0, or -1"):
        IterableWrapper(roots).list_files(length=-2)
    with pytest.raises(TypeError, match=r"pass length=N to list_files\(\)"):
        len(IterableWrapper(roots).list_files())
    with pytest.raises(TypeError, match=r"use roots\.list_files\(masks\)"):
        FileLister(IterableWrapper(roots))  # type: ignore[arg-type]


def test_length_and_repr(roots):
    dp = IterableWrapper(roots).list_files("*.txt", length=3)
    assert len(dp) == 3
    assert repr(dp) == (
        "RootLister(masks=['*.txt'], recursive=False, abspath=False, non_deterministic=False)"
    )
    assert isinstance(dp, RootLister)


def test_resume_from_every_step(roots):
    check_resume_from_every_step(lambda: IterableWrapper(roots).list_files(recursive=True))


def test_same_output_everywhere(roots):
    epochs = check_same_output_everywhere(
        lambda: IterableWrapper(roots).shuffle().sharding_filter().list_files(recursive=True)
    )
    assert len(epochs[0]) == 5 and epochs[0] != epochs[1]  # reshuffled roots


def test_open_files_takes_torchdata_length(roots):
    opened = IterableWrapper(roots).list_files("*.txt").open_files(length=3)
    assert len(opened) == 3
    assert [stream.read() for _, stream in opened] == ["a.txt", "b.txt", "z.txt"]


# -- list_files_by_fsspec ---------------------------------------------------------------


@pytest.fixture
def memory_roots():
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe({"/lr/a/2.txt": b"", "/lr/a/1.txt": b"", "/lr/a/sub/3.txt": b"", "/lr/b/4.bin": b""})
    yield ["memory://lr/a", "memory://lr/b"]
    fs.rm("/lr", recursive=True)


def test_list_files_by_fsspec_lists_each_root_sorted(memory_roots):
    from pipeloom.datapipes import FSSpecRootLister

    dp = IterableWrapper(memory_roots).list_files_by_fsspec()
    assert isinstance(dp, FSSpecRootLister)
    assert list(dp) == ["memory:///lr/a/1.txt", "memory:///lr/a/2.txt", "memory:///lr/b/4.bin"]
    deep = IterableWrapper(memory_roots).list_files_by_fsspec("*.txt", recursive=True)
    assert list(deep) == [
        "memory:///lr/a/1.txt",
        "memory:///lr/a/2.txt",
        "memory:///lr/a/sub/3.txt",
    ]
    assert repr(deep) == "FSSpecRootLister(masks=['*.txt'], recursive=True)"
    with pytest.raises(TypeError, match=r"expects root URLs \(str\), got int"):
        list(IterableWrapper([1]).list_files_by_fsspec())


def test_list_files_by_fsspec_resumes_and_runs_everywhere(memory_roots):
    check_resume_from_every_step(lambda: IterableWrapper(memory_roots).list_files_by_fsspec())
    epochs = check_same_output_everywhere(
        lambda: IterableWrapper(memory_roots).sharding_filter().list_files_by_fsspec(recursive=True)
    )
    assert len(epochs[0]) == 4
