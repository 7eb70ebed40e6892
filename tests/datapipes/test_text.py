"""LineReader and CSVParser: lines and rows of each stream, closed when read, resumable."""

from __future__ import annotations

import io
import os
import random

import pytest

from pipeloom.datapipes import (
    CSVParser,
    FileLister,
    IterableWrapper,
    IterDataPipe,
    LineReader,
    NotAvailable,
    reset_pipeline,
)
from pipeloom.testing import check_resume_from_every_step, collect, collect_async


@pytest.fixture
def texts(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\r\nthree")
    (tmp_path / "b.txt").write_text("four\n\nsix\n")
    return tmp_path


@pytest.fixture
def csvs(tmp_path):
    (tmp_path / "1.csv").write_text("# generated\nname,n\nx,1\ny,2\n")
    (tmp_path / "2.csv").write_text("# generated\nname,n\nz,3\n")
    return tmp_path


def test_readlines_yields_path_and_stripped_line(texts):
    pipe = FileLister(texts).open_files().readlines()
    a, b = str(texts / "a.txt"), str(texts / "b.txt")
    want = [(a, "one"), (a, "two"), (a, "three"), (b, "four"), (b, ""), (b, "six")]
    assert collect(pipe) == want and collect_async(pipe) == want


def test_readlines_can_keep_newlines_and_drop_paths(texts):
    pipe = (
        FileLister(texts, "a.txt")
        .open_files("rb")
        .readlines(strip_newline=False, return_path=False)
    )
    assert collect(pipe) == [b"one\n", b"two\r\n", b"three"]


def test_readlines_closes_each_file_it_finishes(texts):
    before = len(os.listdir("/proc/self/fd"))
    opener = FileLister(texts).open_files()
    assert len(collect(opener.readlines())) == 6
    assert all(stream.closed for _, _, stream in opener._handed)
    assert len(os.listdir("/proc/self/fd")) == before


def test_readlines_resumes_mid_file(texts):
    check_resume_from_every_step(lambda: FileLister(texts).open_files().readlines())


def test_parse_csv_rows_lists_and_dicts(csvs):
    files = FileLister(csvs).open_files()
    assert collect(files.parse_csv(skip_lines=1)) == [
        ["name", "n"],
        ["x", "1"],
        ["y", "2"],
        ["name", "n"],
        ["z", "3"],
    ]
    assert collect(files.parse_csv(skip_lines=1, as_dict=True, return_path=True)) == [
        (str(csvs / "1.csv"), {"name": "x", "n": "1"}),
        (str(csvs / "1.csv"), {"name": "y", "n": "2"}),
        (str(csvs / "2.csv"), {"name": "z", "n": "3"}),
    ]


def test_parse_csv_reads_binary_streams_as_utf8_with_any_delimiter():
    files = IterableWrapper([("t.tsv", io.BytesIO("é\t1\n".encode()))])
    assert list(CSVParser(files, delimiter="\t")) == [["é", "1"]]


def test_parse_csv_with_more_skipped_lines_than_the_file_has_yields_nothing():
    assert list(CSVParser(IterableWrapper([("s.csv", io.StringIO("a\n"))]), skip_lines=5)) == []


def test_parse_csv_resumes_mid_file(csvs):
    check_resume_from_every_step(
        lambda: FileLister(csvs).open_files().parse_csv(skip_lines=1, as_dict=True)
    )


def test_bad_arguments_are_rejected():
    source = IterableWrapper([])
    with pytest.raises(ValueError, match="delimiter must be a 1-character string, got ';;'"):
        CSVParser(source, delimiter=";;")
    with pytest.raises(ValueError, match="skip_lines must be an int >= 0, got -1"):
        CSVParser(source, skip_lines=-1)
    with pytest.raises(TypeError, match="return_path must be a bool, got str 'yes'"):
        LineReader(source, return_path="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"expects \(path, stream\) items, got str"):
        list(LineReader(IterableWrapper(["a.txt"])))
    with pytest.raises(ValueError, match="unknown encoding 'utf-99'"):
        LineReader(source, encoding="utf-99")
    with pytest.raises(ValueError, match="unknown errors handler 'loud'"):
        CSVParser(source, errors="loud")
    with pytest.raises(ValueError, match="as_tuple=True and as_dict=True contradict"):
        CSVParser(source, as_tuple=True, as_dict=True)
    with pytest.raises(TypeError, match=r"CSV format parameters \{'quoting': 'lots'\}"):
        source.parse_csv(quoting="lots")
    assert repr(LineReader(source)) == (
        "LineReader(skip_lines=0, decode=False, return_path=True, strip_newline=True)"
    )
    assert repr(CSVParser(source)) == (
        "CSVParser(skip_lines=0, decode=True, return_path=False, delimiter=',', as_tuple=False)"
    )
    assert repr(source.parse_csv_as_dict(delimiter=";", quotechar="'")) == (
        "CSVParser(skip_lines=0, decode=True, return_path=False, delimiter=';', as_dict=True, "
        'quotechar="\'")'
    )


class Flaky(IterDataPipe):
    def __init__(self, make_items, seed=0):
        self.make_items, self.seed = make_items, seed
        self._items, self._rng = None, random.Random(seed)

    def reset(self):
        self._items, self._rng = None, random.Random(self.seed)

    def async_next(self):
        if self._items is None:
            self._items = iter(self.make_items())
        if self._rng.random() < 0.5:
            raise NotAvailable
        return next(self._items)


def test_survives_not_available_from_upstream():
    def streams():
        return [(f"f{i}", io.StringIO("\n".join(map(str, range(i))))) for i in range(5)]

    pipe = LineReader(Flaky(streams), return_path=False)
    reset_pipeline(pipe)
    got = []
    while True:
        try:
            got.append(pipe.async_next())
        except NotAvailable:
            continue
        except StopIteration:
            break
    assert got == [str(j) for i in range(5) for j in range(i)]


# -- torchdata 0.9's arguments -------------------------------------------------


def test_readlines_skips_lines_decodes_bytes_and_strips_both_ends():
    data = "# header\n\rcafé\r\nlast".encode("latin-1")
    files = IterableWrapper([("f.txt", io.BytesIO(data))])
    assert list(files.readlines(skip_lines=1)) == [("f.txt", b"caf\xe9"), ("f.txt", b"last")]
    files = IterableWrapper([("f.txt", io.BytesIO(data))])
    decoded = files.readlines(skip_lines=1, decode=True, encoding="latin-1", return_path=False)
    assert list(decoded) == ["café", "last"]
    files = IterableWrapper([("f.txt", io.BytesIO(data))])
    ignored = files.readlines(decode=True, return_path=False)  # utf-8, errors="ignore"
    assert list(ignored) == ["# header", "caf", "last"]
    files = IterableWrapper([("f.txt", io.BytesIO(b"\xff\n"))])
    with pytest.raises(UnicodeDecodeError):
        list(files.readlines(decode=True, errors="strict"))


def test_parse_csv_takes_format_parameters_tuples_and_dicts():
    text = "skip me\n'a; b';c\n1;2\n"

    def files():
        return IterableWrapper([("x.csv", io.BytesIO(text.encode()))])

    rows = files().parse_csv(skip_lines=1, delimiter=";", quotechar="'", as_tuple=True)
    assert list(rows) == [("a; b", "c"), ("1", "2")]
    dicts = files().parse_csv_as_dict(skip_lines=1, delimiter=";", quotechar="'", return_path=True)
    assert list(dicts) == [("x.csv", {"a; b": "1", "c": "2"})]
    raw = files().parse_csv(decode=False)
    with pytest.raises(ValueError, match=r"malformed CSV in 'x.csv'.*pass decode=True"):
        list(raw)


def test_readers_take_bytes_items_such_as_tar_members():
    members = IterableWrapper([("s.tar/a.csv", b"x,y\n1,2\n"), ("s.tar/b.csv", b"x,y\n3,4\n")])
    assert list(members.parse_csv_as_dict()) == [{"x": "1", "y": "2"}, {"x": "3", "y": "4"}]
    assert list(members.readlines(decode=True, return_path=False)) == ["x,y", "1,2", "x,y", "3,4"]


def test_parse_csv_as_dict_resumes_mid_file(csvs):
    check_resume_from_every_step(
        lambda: FileLister(csvs).open_files("rb").parse_csv_as_dict(skip_lines=1, return_path=True)
    )


def test_readers_give_the_same_rows_everywhere(csvs):
    from tests.datapipes.everywhere import check_same_output_everywhere

    epochs = check_same_output_everywhere(
        lambda: (
            FileLister(csvs)
            .shuffle()
            .sharding_filter()
            .open_files()
            .parse_csv_as_dict(skip_lines=1)
        )
    )
    assert sorted(row["n"] for row in epochs[0]) == ["1", "2", "3"]
