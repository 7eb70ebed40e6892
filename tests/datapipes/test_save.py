"""Saver (save_to_disk) and FSSpecSaver (save_by_fsspec)."""

from __future__ import annotations

import io
import os

import pytest

from pipeloom.datapipes import FSSpecSaver, IterableWrapper, Saver
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere


def test_writes_bytes_text_and_streams_creating_directories(tmp_path):
    items = [("a/1.bin", b"one"), ("b/c/2.bin", io.BytesIO(b"two"))]
    saved = list(IterableWrapper(items).save_to_disk(mode="wb", filepath_fn=lambda p: tmp_path / p))
    assert saved == [tmp_path / "a/1.bin", tmp_path / "b/c/2.bin"]
    assert (tmp_path / "b/c/2.bin").read_bytes() == b"two"
    text = list(IterableWrapper([(str(tmp_path / "t.txt"), "text")]).save_to_disk())
    assert text == [str(tmp_path / "t.txt")] and (tmp_path / "t.txt").read_text() == "text"
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "t.txt"]  # no temporary file left


def test_a_failed_write_leaves_no_file(tmp_path):
    target = tmp_path / "x.txt"
    with pytest.raises(TypeError, match=r"cannot write a bytes to .*x\.txt.*takes str"):
        list(IterableWrapper([(str(target), b"bytes")]).save_to_disk(mode="w"))
    assert os.listdir(tmp_path) == []


def test_mode_b_means_wb_and_bad_modes_are_rejected(tmp_path):
    assert Saver(IterableWrapper([]), "b").mode == "wb"
    with pytest.raises(ValueError, match=r"save_to_disk\(\) mode must be 'w' \(text\) or 'wb'"):
        IterableWrapper([]).save_to_disk(mode="a")
    with pytest.raises(TypeError, match="expects filepath_fn to be a callable"):
        IterableWrapper([]).save_to_disk(filepath_fn="out/")
    with pytest.raises(TypeError, match=r"expects \(path, data\) items"):
        list(IterableWrapper(["x"]).save_to_disk())
    assert repr(Saver(IterableWrapper([]), "wb", str)) == "Saver(mode='wb', filepath_fn=str)"


def test_save_by_fsspec_writes_to_any_file_system():
    import fsspec

    items = IterableWrapper([("a.txt", b"A"), ("b.txt", b"B")])
    saved = list(items.save_by_fsspec("wb", filepath_fn=lambda p: f"memory://saved/{p}"))
    assert saved == ["memory://saved/a.txt", "memory://saved/b.txt"]
    assert fsspec.filesystem("memory").cat("/saved/b.txt") == b"B"
    assert isinstance(items.save_by_fsspec(), FSSpecSaver)


def test_resume_from_every_step(tmp_path):
    check_resume_from_every_step(
        lambda: IterableWrapper([(f"{i}.txt", str(i)) for i in range(5)]).save_to_disk(
            filepath_fn=lambda p: os.path.relpath(tmp_path / p)
        )
    )


def test_same_output_everywhere(tmp_path):
    epochs = check_same_output_everywhere(
        lambda: (
            IterableWrapper([(f"{i}.txt", str(i)) for i in range(6)])
            .sharding_filter()
            .save_to_disk(filepath_fn=lambda p: str(tmp_path / p))
        )
    )
    assert epochs[0] == [str(tmp_path / f"{i}.txt") for i in range(6)]
    assert (tmp_path / "5.txt").read_text() == "5"
