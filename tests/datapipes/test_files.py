"""FileLister and FileOpener: sorted compact listings, no leaked descriptors, sharding."""

from __future__ import annotations

import copy
import gc
import os
import random

import pytest
from hypothesis import given, settings

from pipeloom.datapipes import (
    CompactStringList,
    Decoder,
    FileLister,
    FileOpener,
    HttpReader,
    IterableWrapper,
    IterDataPipe,
    NotAvailable,
    TarArchiveLoader,
    current_position,
    reset_pipeline,
)
from pipeloom.datapipes import _files as files_module
from pipeloom.errors import StateError
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.helpers import drain_retrying
from tests.strategies import shard_counts


def _fds() -> int:
    gc.collect()  # count only live files, not what earlier tests left to the collector
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def tree(tmp_path):
    for name in ("b.txt", "a.txt", "c.csv", "sub/d.txt", "sub/deeper/e.txt"):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"content of {name}\nline 2\n")
    return tmp_path


def _rel(paths, root):
    return [os.path.relpath(p, root) for p in paths]


class ReadAndClose(IterDataPipe):
    """Test consumer: reads each stream whole and closes it (like tar/readlines do)."""

    inputs = ("source",)

    def __init__(self, source):
        self.source = source

    def async_next(self):
        path, stream = self.source.async_next()
        with stream:
            return os.path.basename(path), stream.read()

    def state_dict(self):
        return {}


class Flaky(IterDataPipe):
    """Test source that raises NotAvailable at random points (driven by repeated calls)."""

    def __init__(self, items, seed=0):
        self.items, self.seed = list(items), seed
        self._index, self._rng = 0, random.Random(seed)

    def reset(self):
        self._index, self._rng = 0, random.Random(self.seed)

    def async_next(self):
        if self._rng.random() < 0.5:
            raise NotAvailable
        if self._index >= len(self.items):
            raise StopIteration
        self._index += 1
        return self.items[self._index - 1]


# -- FileLister -----------------------------------------------------------------------


def test_lists_matching_files_sorted(tree):
    assert _rel(FileLister(str(tree), "*.txt"), tree) == ["a.txt", "b.txt"]
    assert _rel(FileLister(tree, ["*.csv", "b*"]), tree) == ["b.txt", "c.csv"]


def test_recursive_listing_is_sorted_by_full_path(tree):
    listed = _rel(FileLister(tree, "*.txt", recursive=True), tree)
    assert listed == ["a.txt", "b.txt", "sub/d.txt", "sub/deeper/e.txt"]


def test_non_deterministic_listing_has_the_same_files(tree):
    fast = FileLister(tree, recursive=True, non_deterministic=True)
    assert sorted(fast) == list(FileLister(tree, recursive=True))


def test_file_roots_and_several_roots_and_abspath(tree, monkeypatch):
    monkeypatch.chdir(tree)
    assert list(FileLister(["b.txt", "sub"], "*.txt")) == ["b.txt", "sub/d.txt"]
    assert list(FileLister("sub", abspath=True)) == [str(tree / "sub" / "d.txt")]


def test_listing_is_stored_compactly_and_reused_every_epoch(tree):
    lister = FileLister(tree, "*.txt")
    first = list(lister)
    assert isinstance(lister.listing(), CompactStringList)
    (tree / "new.txt").write_text("late")
    assert list(lister) == first and len(lister) == 2


def test_missing_root_raises_naming_the_root(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=r"root '.*nope' does not exist"):
        list(FileLister(missing))


def test_mask_matching_nothing_warns_and_yields_an_empty_epoch(tree):
    with pytest.warns(UserWarning, match=r"no file under .* matches masks \['\*.parquet'\]"):
        assert list(FileLister(tree, "*.parquet")) == []


def test_bad_lister_arguments_are_rejected():
    with pytest.raises(TypeError, match="root must be a path or a non-empty list"):
        FileLister(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="masks must be a str or a list of str"):
        FileLister(".", masks=3)  # type: ignore[arg-type]


def test_lister_repr_shows_its_arguments():
    assert repr(FileLister("/d", "*.tar")) == (
        "FileLister(root='/d', masks=['*.tar'], recursive=False, abspath=False, "
        "non_deterministic=False)"
    )


def test_lister_resumes_from_every_step(tree):
    check_resume_from_every_step(lambda: FileLister(tree, recursive=True))


def test_lister_stamps_each_path_with_its_position(tree):
    lister = FileLister(tree, recursive=True)
    reset_pipeline(lister)
    positions = []
    while True:
        try:
            lister.async_next()
        except StopIteration:
            break
        positions.append(current_position())
    assert positions == list(range(5))


# -- FileOpener -----------------------------------------------------------------------


def test_opens_each_path_in_text_or_binary_mode(tree):
    lister = FileLister(tree, "*.txt")
    texts = collect(ReadAndClose(FileOpener(lister)))
    assert texts == [
        ("a.txt", "content of a.txt\nline 2\n"),
        ("b.txt", "content of b.txt\nline 2\n"),
    ]
    binary = collect_async(ReadAndClose(lister.open_files("rb")))
    assert binary == [(n, t.encode()) for n, t in texts]


def test_encoding_is_used_in_text_mode(tmp_path):
    (tmp_path / "l1.txt").write_bytes("é".encode("latin-1"))
    assert collect(ReadAndClose(FileOpener(FileLister(tmp_path), encoding="latin-1"))) == [
        ("l1.txt", "é")
    ]


def test_bad_opener_arguments_are_rejected(tree):
    with pytest.raises(ValueError, match="mode must be one of 'r', 'rt', 'rb'"):
        FileOpener(FileLister(tree), mode="w")
    with pytest.raises(ValueError, match="encoding='utf-8' needs a text mode"):
        FileOpener(FileLister(tree), mode="rb", encoding="utf-8")
    with pytest.raises(TypeError, match="expects an IterDataPipe of paths, got list"):
        FileOpener(["a"])  # type: ignore[arg-type]
    assert repr(FileOpener(FileLister(tree), "b")) == "FileOpener(mode='rb', encoding=None)"


def test_unreadable_path_raises_naming_it(tree):
    opener = FileOpener(IterableWrapper([str(tree / "sub"), str(tree / "gone.txt")]))
    with pytest.raises(IsADirectoryError, match="sub"):
        list(opener)
    with pytest.raises(FileNotFoundError, match="gone.txt"):
        list(FileOpener(IterableWrapper([str(tree / "gone.txt")])))


def test_non_path_items_are_rejected():
    with pytest.raises(TypeError, match="expects paths \\(str\\), got int 3"):
        list(FileOpener(IterableWrapper([3])))


def test_early_stop_then_reset_closes_every_stream(tree):
    before = _fds()
    opener = FileOpener(FileLister(tree, recursive=True))
    it = iter(opener)
    held = [next(it) for _ in range(3)]
    assert _fds() == before + 3
    reset_pipeline(opener)
    assert _fds() == before and all(stream.closed for _, stream in held)


def test_dropping_the_pipeline_closes_its_streams(tree):
    before = _fds()
    opener = FileOpener(FileLister(tree, recursive=True))
    it = iter(opener)
    next(it), next(it)
    del it, opener
    gc.collect()
    assert _fds() == before


def test_close_closes_open_streams_and_consumed_streams_are_forgotten(tree):
    before = _fds()
    opener = FileOpener(FileLister(tree, recursive=True))
    assert len(collect(ReadAndClose(opener))) == 5
    assert _fds() == before
    assert all(stream.closed for _, _, stream in opener._handed)
    it = iter(opener)
    next(it)
    opener.close()
    assert _fds() == before


def test_opener_resumes_from_every_step_reopening_unfinished_streams(tree):
    check_resume_from_every_step(lambda: ReadAndClose(FileOpener(FileLister(tree, recursive=True))))


def test_survives_not_available_from_upstream(tree):
    paths = list(FileLister(tree, recursive=True))
    expected = collect(ReadAndClose(FileOpener(IterableWrapper(paths))))
    assert drain_retrying(ReadAndClose(FileOpener(Flaky(paths)))) == expected


@settings(max_examples=20, deadline=None)
@given(total=shard_counts)
def test_sharded_copies_open_disjoint_shards_that_cover_everything(tmp_path_factory, total):
    root = tmp_path_factory.mktemp("shards")
    for i in range(11):
        (root / f"{i:02d}.txt").write_text(str(i))
    pipe = ReadAndClose(FileOpener(FileLister(root)))
    opened: list[str] = []
    real_open = open

    def counting_open(path, *args, **kwargs):
        opened.append(os.path.basename(path))
        return real_open(path, *args, **kwargs)

    outputs = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(files_module, "open", counting_open, raising=False)
        for index in range(total):
            replica = copy.deepcopy(pipe)
            replica.source.sharding_settings(total, index)
            assert replica.source.is_shardable() and not replica.source.source.is_shardable()
            opened.clear()
            reset_pipeline(replica)
            got = []
            while True:
                try:
                    got.append(replica.async_next())
                except StopIteration:
                    break
                assert current_position() % total == index
            assert opened == [name for name, _ in got]
            assert len(got) == len(replica.source) == len(range(index, 11, total))
            outputs.extend(got)
    assert sorted(outputs) == [(f"{i:02d}.txt", str(i)) for i in range(11)]


def test_bad_sharding_settings_are_rejected(tree):
    opener = FileOpener(FileLister(tree))
    with pytest.raises(ValueError, match="total must be an int >= 1, got 0"):
        opener.sharding_settings(0, 0)
    with pytest.raises(ValueError, match=r"index must be an int in \[0, 2\), got 2"):
        opener.sharding_settings(2, 2)


# -- bad states are refused, naming the block and the field --------------------------------------


def storage_blocks():
    source = IterableWrapper([])
    return {
        "FileLister": FileLister("."),
        "FileOpener": FileOpener(source),
        "HttpReader": HttpReader(source),
        "TarArchiveLoader": TarArchiveLoader(source),
        "Decoder": Decoder(source),
    }


@pytest.mark.parametrize(
    "block,state,message",
    [
        ("FileLister", {"position": 3.5}, r"FileLister\(.*'position' must be an int >= 0, got 3.5"),
        ("FileLister", {"position": "xyz"}, r"'position' must be an int >= 0, got 'xyz'"),
        ("FileLister", {"position": -1}, r"'position' must be an int >= 0, got -1"),
        ("FileLister", {"position": True}, r"'position' must be an int >= 0, got True"),
        ("FileLister", {}, r"FileLister\(.*must be a dict with the field 'position'"),
        ("FileOpener", {"position": 2, "replay": "x"}, r"FileOpener\(.*'replay' must be a list"),
        ("FileOpener", {"position": 2, "replay": [(5, "a")]}, r"0 <= position < 2"),
        ("FileOpener", {"position": 2, "replay": [(0, 7)]}, r"'replay' must be a list"),
        ("HttpReader", {"position": None, "replay": []}, r"HttpReader\(.*'position' must be"),
        ("TarArchiveLoader", {"skip": 1.5}, r"TarArchiveLoader\(.*'skip' must be an int >= 0"),
        ("TarArchiveLoader", [1], r"must be a dict with the field 'skip'"),
        ("Decoder", {"x": 1}, r"Decoder\(.*keeps no state"),
    ],
)
def test_bad_states_raise_a_state_error_naming_the_block_and_field(block, state, message):
    with pytest.raises(StateError, match=message):
        storage_blocks()[block].load_state_dict(state)


def test_good_states_still_load():
    blocks = storage_blocks()
    blocks["FileOpener"].load_state_dict({"position": 3, "replay": [[1, "a"], (2, "b")]})
    assert blocks["FileOpener"]._replay == [(1, "a"), (2, "b")]
    blocks["TarArchiveLoader"].load_state_dict({"skip": 4})
    assert blocks["TarArchiveLoader"].state_dict() == {"skip": 4}
