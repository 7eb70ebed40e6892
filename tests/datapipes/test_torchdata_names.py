"""pipeloom.datapipes.iter / .map: torchdata 0.9's class names over pipeloom's blocks."""

from __future__ import annotations

import io

import pytest

import pipeloom.datapipes as dp


def test_every_exported_name_exists_and_is_callable():
    for module in (dp.iter, dp.map):
        for name in module.__all__:
            assert callable(getattr(module, name)), name


def test_file_lister_takes_paths_or_a_block_of_roots(tmp_path):
    for name in ("b.csv", "a.csv", "c.txt"):
        (tmp_path / name).write_text(name)
    by_path = list(dp.iter.FileLister(str(tmp_path), "*.csv"))
    by_pipe = list(dp.iter.FileLister(dp.iter.IterableWrapper([str(tmp_path)]), "*.csv"))
    assert by_path == by_pipe == [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]
    assert len(dp.iter.FileLister([str(tmp_path)], "*.csv", length=2)) == 2


def test_file_opener_takes_any_iterable_of_paths(tmp_path):
    (tmp_path / "a.txt").write_text("A")
    opened = dp.iter.FileOpener([str(tmp_path / "a.txt")], mode="r")
    assert [stream.read() for _, stream in opened] == ["A"]


def test_renamed_blocks_and_functions():
    source = dp.iter.IterableWrapper([(1, "a"), (2, "b")])
    numbers, letters = dp.iter.UnZipper(source, sequence_length=2)
    assert (list(numbers), list(letters)) == ([1, 2], ["a", "b"])
    even, odd = dp.iter.RoundRobinDemultiplexer(dp.iter.IterableWrapper(range(4)), 2)
    assert (list(even), list(odd)) == ([0, 2], [1, 3])
    streams = dp.iter.IterableWrapper([("s", io.StringIO("abc"))])
    assert list(dp.iter.StreamReader(streams, chunk=2)) == [("s", "ab"), ("s", "c")]
    assert list(dp.iter.UnBatcher(dp.iter.IterableWrapper([[1], [2]]))) == [1, 2]
    shuffled = dp.iter.Shuffler(dp.iter.IterableWrapper([[1, 2], [3]]), unbatch_level=1)
    assert sorted(shuffled) == [1, 2, 3]
    rows = dp.iter.CSVDictParser(dp.iter.IterableWrapper([("f", io.StringIO("a\n1\n"))]))
    assert list(rows) == [{"a": "1"}]


def test_map_style_names():
    table = dp.map.SequenceWrapper([(0, "x"), (1, "y")])
    assert dp.map.Mapper(table)[1] == (1, "y")  # torchdata's default fn: the identity
    first, second = dp.map.UnZipper(table, sequence_length=2)
    assert (first[1], second[0]) == (1, "x")
    assert sorted(dp.map.Shuffler(table, indices=[1, 0])) == [(0, "x"), (1, "y")]
    assert len(dp.map.Batcher(table, 2)) == 1 and dp.map.Zipper(table, table)[0][1] == (0, "x")


def test_fsspec_lister_takes_one_url_a_list_or_a_block():
    fsspec = pytest.importorskip("fsspec")
    fsspec.filesystem("memory").pipe({"/names/a.txt": b""})
    expected = ["memory:///names/a.txt"]
    assert list(dp.iter.FSSpecFileLister("memory://names")) == expected
    assert list(dp.iter.FSSpecFileLister(["memory://names"])) == expected
    fsspec.filesystem("memory").rm("/names", recursive=True)
