"""HashChecker (check_hash): digests checked, streams handed on from their start."""

from __future__ import annotations

import hashlib
import io

import pytest

from pipeloom.datapipes import FileLister, HashChecker, IterableWrapper
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere


@pytest.fixture
def files(tmp_path):
    digests = {}
    for index in range(4):
        path = tmp_path / f"{index}.bin"
        path.write_bytes(bytes([index]) * (index + 1) * 1000)
        digests[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return tmp_path, digests


def test_checks_streams_and_rewinds_them(files):
    root, digests = files
    items = FileLister(root).open_files("rb").check_hash(digests)
    assert [stream.read() for _, stream in items] == [bytes([i]) * (i + 1) * 1000 for i in range(4)]


def test_bytes_str_and_other_algorithms():
    data = {"a": b"abc", "b": "abc"}
    md5 = hashlib.md5(b"abc").hexdigest()
    items = IterableWrapper(list(data.items())).check_hash({"a": md5, "b": md5.upper()}, "md5")
    assert list(items) == [("a", b"abc"), ("b", "abc")]
    blake = hashlib.blake2b(b"abc").hexdigest()
    assert list(IterableWrapper([("a", b"abc")]).check_hash({"a": blake}, "blake2b"))


def test_unseekable_streams_are_kept_in_memory_to_rewind():
    class Unseekable(io.RawIOBase):
        def __init__(self):
            self._data = io.BytesIO(b"stream!")

        def readable(self):
            return True

        def readinto(self, buffer):
            return self._data.readinto(buffer)

    stream = io.BufferedReader(Unseekable())
    digest = hashlib.sha256(b"stream!").hexdigest()
    [(_, out)] = list(IterableWrapper([("u", stream)]).check_hash({"u": digest}))
    assert out.read() == b"stream!" and stream.closed
    [(_, left)] = list(
        IterableWrapper([("s", io.BytesIO(b"stream!"))]).check_hash({"s": digest}, rewind=False)
    )
    assert left.read() == b""


def test_mismatch_and_missing_digest_are_explained():
    with pytest.raises(ValueError, match=r"sha256 digest of 'a' is [0-9a-f]+, expected 00.*delete"):
        list(IterableWrapper([("a", b"x")]).check_hash({"a": "00"}))
    with pytest.raises(KeyError, match="no expected digest for 'b'"):
        list(IterableWrapper([("b", b"x")]).check_hash({"a": "00"}))
    with pytest.raises(ValueError, match="hash_type must be a hashlib algorithm"):
        IterableWrapper([]).check_hash({}, "crc99")
    with pytest.raises(TypeError, match="hash_dict must map each path"):
        IterableWrapper([]).check_hash(["a"])
    with pytest.raises(TypeError, match=r"expects \(path, data\) items"):
        list(IterableWrapper(["a"]).check_hash({}))


def test_length_and_repr():
    dp = IterableWrapper([("a", b"")] * 2).check_hash({"a": "x"}, "md5", rewind=False)
    assert isinstance(dp, HashChecker) and len(dp) == 2
    assert repr(dp) == "HashChecker(hash_type='md5', rewind=False, paths=1)"


def test_resume_from_every_step(files):
    root, digests = files
    check_resume_from_every_step(
        lambda: FileLister(root).open_files("rb").check_hash(digests).read_from_stream()
    )


def test_same_output_everywhere(files):
    root, digests = files
    epochs = check_same_output_everywhere(
        lambda: (
            FileLister(root)
            .shuffle()
            .sharding_filter()
            .open_files("rb")
            .check_hash(digests)
            .read_from_stream()
        )
    )
    assert len(epochs[0]) == 4
