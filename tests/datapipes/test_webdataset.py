"""WebDataset: consecutive tar members sharing a key become one sample dict."""

from __future__ import annotations

import io
import random
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import (
    FileLister,
    IterableWrapper,
    IterDataPipe,
    NotAvailable,
    WebDataset,
    reset_pipeline,
)
from pipeloom.datapipes._webdataset import split_key
from pipeloom.testing import check_resume_from_every_step, collect, collect_async


def write_with_tarfile(path, samples):
    with tarfile.open(path, "w") as tar:
        for sample in samples:
            for ext, data in sorted(sample.items()):
                if ext == "__key__":
                    continue
                info = tarfile.TarInfo(f"{sample['__key__']}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def make_samples(shard, count=3):
    return [
        {"__key__": f"part/sample{shard}{i:03d}", "jpg": bytes([i]) * 10, "cls": str(i).encode()}
        for i in range(count)
    ]


def expected(path, samples):
    return [
        {
            "__key__": f"{path}/{s['__key__']}",
            "__url__": str(path),
            **{f".{k}": v for k, v in sorted(s.items()) if k != "__key__"},
        }
        for s in samples
    ]


@pytest.fixture
def shards(tmp_path):
    for shard in range(2):
        write_with_tarfile(tmp_path / f"shard-{shard}.tar", make_samples(shard))
    return tmp_path


def pipeline(root):
    return FileLister(root, "*.tar").open_files("rb").load_from_tar().webdataset()


def test_groups_members_of_tarfile_written_shards(shards):
    want = [s for i in range(2) for s in expected(shards / f"shard-{i}.tar", make_samples(i))]
    assert collect(pipeline(shards)) == want
    assert collect_async(pipeline(shards)) == want


def test_reads_shards_written_by_the_webdataset_library(tmp_path):
    wds = pytest.importorskip("webdataset", reason="webdataset is an optional test dependency")
    samples = make_samples(7, count=4)
    with wds.TarWriter(str(tmp_path / "w.tar")) as writer:
        for sample in samples:
            writer.write(sample)
    assert collect(pipeline(tmp_path)) == expected(tmp_path / "w.tar", samples)


def test_key_is_the_path_up_to_the_first_dot_of_the_file_name():
    assert split_key("a.b/dir/x.seg.PNG") == ("a.b/dir/x", ".seg.png")
    assert split_key("0001.cls") == ("0001", ".cls")
    assert split_key("dir/noext") is None and split_key("dir/.hidden") is None
    members = [("s.tar/x.seg.png", b"1"), ("s.tar/x.JSON", b"2"), ("s.tar/README", b"?")]
    assert list(WebDataset(IterableWrapper(members))) == [
        {"__key__": "s.tar/x", "__url__": "s.tar", ".seg.png": b"1", ".json": b"2"}
    ]


def test_duplicate_extension_in_a_sample_raises():
    members = [("s.tar/a.jpg", b"1"), ("s.tar/a.jpg", b"2")]
    with pytest.raises(ValueError, match=r"sample 's.tar/a' has two members with extension '.jpg'"):
        list(WebDataset(IterableWrapper(members)))


def test_bad_input_is_rejected():
    with pytest.raises(TypeError, match="expects an IterDataPipe of"):
        WebDataset([("a.jpg", b"")])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"expects \(path, data\) items, got int"):
        list(WebDataset(IterableWrapper([1])))
    assert repr(WebDataset(IterableWrapper([]))) == "WebDataset()"


def test_resumes_from_every_step(shards):
    check_resume_from_every_step(lambda: pipeline(shards))


class Flaky(IterDataPipe):
    def __init__(self, items, seed):
        self.items, self.seed = items, seed
        self._index, self._rng = 0, random.Random(seed)

    def reset(self):
        self._index, self._rng = 0, random.Random(self.seed)

    def async_next(self):
        if self._rng.random() < 0.5:
            raise NotAvailable
        if self._index == len(self.items):
            raise StopIteration
        self._index += 1
        return self.items[self._index - 1]


member_names = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from([".x", ".y", ".z"])), max_size=20
)


@settings(max_examples=50, deadline=None)
@given(names=member_names, seed=st.integers(0, 1000))
def test_not_available_upstream_never_loses_or_duplicates_a_member(names, seed):
    members = [(f"s/{key}{ext}", i) for i, (key, ext) in enumerate(names)]
    try:
        plain = list(WebDataset(IterableWrapper(members)))
    except ValueError:
        return  # duplicate field in a sample: covered elsewhere
    pipe = WebDataset(Flaky(members, seed))
    reset_pipeline(pipe)
    got = []
    while True:
        try:
            got.append(pipe.async_next())
        except NotAvailable:
            continue
        except StopIteration:
            break
    assert got == plain
    assert sum(len(s) - 2 for s in got) == len(members)
