"""WebDataset: consecutive tar members sharing a key become one sample dict, as in webdataset."""

from __future__ import annotations

import gc
import io
import random
import tarfile
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.datapipes import (
    FileLister,
    IterableWrapper,
    IterDataPipe,
    NotAvailable,
    TarMemberPath,
    WebDataset,
    reset_pipeline,
)
from pipeloom.datapipes._webdataset import split_key, split_shard
from pipeloom.errors import StateError
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
            "__key__": s["__key__"],
            "__url__": str(path),
            "__local_path__": str(path),
            **{k: v for k, v in sorted(s.items()) if k != "__key__"},
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


def test_key_is_the_member_path_up_to_the_first_dot_of_the_file_name():
    assert split_key("a.b/dir/x.seg.PNG") == ("a.b/dir/x", "seg.png")
    assert split_key("0001.cls") == ("0001", "cls")
    assert split_key("dir/noext") is None and split_key("README") is None
    assert split_key("dir/.hidden") == ("dir/", "hidden")  # as the webdataset library splits it
    members = [("s.tar/x.seg.png", b"1"), ("s.tar/x.JSON", b"2"), ("s.tar/README", b"?")]
    assert list(WebDataset(IterableWrapper(members))) == [
        {
            "__key__": "x",
            "__url__": "s.tar",
            "__local_path__": "s.tar",
            "seg.png": b"1",
            "json": b"2",
        }
    ]


def test_the_shard_is_known_from_member_paths_or_found_in_plain_strings():
    member = TarMemberPath("https://host/a.tar/b", "x/0001.jpg")  # a shard path with a ".tar/"
    assert split_shard(member) == ("https://host/a.tar/b", "x/0001.jpg")
    assert split_shard("https://host/d/s.tar.gz/x/0001.jpg") == (
        "https://host/d/s.tar.gz",
        "x/0001.jpg",
    )
    assert split_shard("d/0001.jpg") == ("d", "0001.jpg")
    assert split_shard("https://host/s.tar?sig=a.b/x/0001.jpg") == (  # a signed URL
        "https://host/s.tar?sig=a.b",
        "x/0001.jpg",
    )
    assert split_shard("d/s.tar?/x/0001.jpg") == ("d/s.tar?/x", "0001.jpg")  # a path: '?' in it
    [sample] = WebDataset(IterableWrapper([(member, b"J")]))
    assert sample == {"__key__": "x/0001", "__url__": "https://host/a.tar/b", "jpg": b"J"}


def test_samples_never_span_two_shards_even_with_the_same_key():
    members = [("a.tar/k.jpg", b"1"), ("b.tar/k.jpg", b"2")]
    assert [(s["__url__"], s["jpg"]) for s in WebDataset(IterableWrapper(members))] == [
        ("a.tar", b"1"),
        ("b.tar", b"2"),
    ]


def test_metadata_members_are_skipped_as_the_library_does():
    members = [("s.tar/__meta__", b"m"), ("s.tar/__dir__/x.jpg", b"d"), ("s.tar/k.jpg", b"1")]
    assert [s["__key__"] for s in WebDataset(IterableWrapper(members))] == ["k"]


def test_duplicate_extension_in_a_sample_raises():
    members = [("s.tar/a.jpg", b"1"), ("s.tar/a.jpg", b"2")]
    with pytest.raises(
        ValueError, match=r"sample 'a' of 's.tar' has two members with extension 'jpg'"
    ):
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
    assert sum(len(s) - 3 for s in got) == len(members)  # __key__, __url__, __local_path__


# -- the same sample dicts as the webdataset library -------------------------------------------


def write_mixed_shard(path, shard):
    """Members the library and pipeloom must group alike: dirs, dots, case, metadata, no ext."""
    members = [
        (f"part/s{shard}0.jpg", b"J"),
        (f"part/s{shard}0.CLS", b"1"),
        (f"part/s{shard}0.seg.png", b"P"),
        ("__meta__/info.txt", b"m"),
        ("noext", b"n"),
        ("dir.v2/.hidden", b"h"),  # no key: skipped
        ("dir/.hidden", b"h"),  # key "dir/", field "hidden"
        (f"s{shard}1.json", b"{}"),
        ("a.b.c.jpg", b"1"),  # key "a" (up to the first dot), field "b.c.jpg"
        ("a.b.d.JPG", b"2"),
        ("img1.jpg", b"3"),  # "img1" and "img10": two keys, and "img1" again: a third
        ("img10.jpg", b"4"),
        ("img1.cls", b"5"),
        ("x/y.z/w.jpg", b"6"),  # a dot in a directory is not the key's end
        ("trail.", b"7"),  # field ""
        ("d/__m__/y.jpg", b"8"),  # metadata only at the top of the shard
        ("same.txt", str(shard).encode()),  # the same key in consecutive shards
    ]
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def with_webdataset(paths):
    wds = pytest.importorskip("webdataset", reason="webdataset is an optional test dependency")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # it leaves its shard files open
        samples = list(wds.WebDataset([str(p) for p in paths], shardshuffle=False))
        gc.collect()
    return samples


def test_sample_dicts_equal_the_webdataset_librarys_on_the_same_shards(tmp_path):
    paths = []
    for shard in range(2):
        paths.append(tmp_path / f"mixed-{shard}.tar")
        write_mixed_shard(paths[-1], shard)
    wds = pytest.importorskip("webdataset", reason="webdataset is an optional test dependency")
    paths.append(tmp_path / "written-by-webdataset.tar")
    with wds.TarWriter(str(paths[-1])) as writer:
        for sample in make_samples(9, count=3):
            writer.write(sample)
    theirs = with_webdataset(paths)
    ours = collect(pipeline(tmp_path))
    assert ours == theirs and len(ours) == 25


def test_a_ported_webdataset_map_works_unchanged(shards):
    def to_pair(sample):  # written against webdataset's sample dicts
        return sample["__key__"], int(sample["cls"]), sample["jpg"][:1]

    theirs = [to_pair(s) for s in with_webdataset(sorted(shards.glob("*.tar")))]
    assert collect(pipeline(shards).map(to_pair)) == theirs


def test_a_state_saved_mid_sample_does_not_change_as_iteration_goes_on(shards):
    pipe = pipeline(shards)
    reset_pipeline(pipe)
    source = pipe.source
    source.async_next()  # the first member of the first sample
    pipe.async_next()  # reads on until the second sample starts
    state = pipe.state_dict()
    fields = set(state["sample"])
    pipe.async_next()
    assert set(state["sample"]) == fields


@pytest.mark.parametrize(
    "state,field",
    [
        ({"sample": None, "stamp": None, "ended": "no"}, "ended"),
        ({"sample": {"jpg": b""}, "stamp": None, "ended": False}, "sample"),
        ({"sample": None, "stamp": [0, 0, 3.5], "ended": False}, "stamp"),
        ({"sample": None, "stamp": None}, "ended"),
        ("xyz", "sample"),
    ],
)
def test_bad_states_raise_a_state_error_naming_the_field(state, field):
    with pytest.raises(StateError, match=rf"WebDataset(\(\))?: .*'{field}'"):
        WebDataset(IterableWrapper([])).load_state_dict(state)


def _shard_bytes(name: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for i in range(3):
            for ext, payload in (("jpg", b"J" * 600), ("cls", b"%d" % i)):
                info = tarfile.TarInfo(f"{name}_{i}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


@pytest.mark.parametrize("on_error", ["skip", "warn"])
@pytest.mark.parametrize("order", ["cut first", "cut last"])
def test_a_sample_whose_shard_was_cut_short_is_dropped_never_given_without_fields(on_error, order):
    # Cut inside a_1.cls's data: a_1.jpg was read whole, a_1.cls is lost. The sample
    # {"jpg"} of key a_1 came out without its "cls" once the next shard (or the end) came.
    shards = {"a.tar": _shard_bytes("a")[:4096], "b.tar": _shard_bytes("b")}
    names = ["a.tar", "b.tar"] if order == "cut first" else ["b.tar", "a.tar"]
    source = IterableWrapper([(name, io.BytesIO(shards[name])) for name in names])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = list(source.load_from_tar(on_error=on_error).webdataset())
    assert {s["__key__"]: sorted(k for k in s if k[0] != "_") for s in samples} == {
        "a_0": ["cls", "jpg"],
        "b_0": ["cls", "jpg"],
        "b_1": ["cls", "jpg"],
        "b_2": ["cls", "jpg"],
    }
    assert len(caught) == (on_error == "warn")


class _ResetStream(io.RawIOBase):
    def readable(self):
        return True

    def readinto(self, buffer):
        raise ConnectionResetError("GET http://h/b.tar: connection reset")


def _open_cut_or_broken(name):
    return (name, io.BytesIO(_shard_bytes("a")[:4096]) if name == "a.tar" else _ResetStream())


def test_a_failing_shard_after_a_dropped_sample_still_raises():
    # The next shard's stream fails (always raised) while the cut shard's last sample is
    # held: dropping that sample must not end the epoch quietly, losing the error.
    pipe = IterableWrapper(["a.tar", "b.tar"]).map(_open_cut_or_broken)
    pipe = pipe.load_from_tar(on_error="skip").webdataset().map(lambda s: s["__key__"])
    got = []
    with pytest.raises(ConnectionResetError, match="GET http://h/b.tar"):
        for key in DataLoader(pipe, seed=0):
            got.append(key)
    assert got == ["a_0"]
