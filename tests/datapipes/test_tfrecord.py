"""TFRecordLoader (load_from_tfrecord): TFRecord frames and Example records."""

from __future__ import annotations

import functools
import io
import struct

import pytest
import torch

from pipeloom.datapipes import FileLister, IterableWrapper, TFRecordLoader
from pipeloom.datapipes._tfrecord import crc32c, masked_crc32c
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere
from tests.migration.encoding import encode
from tests.migration.make_data import _feature, _features, _field, _frame, make_data


def example(**features):
    return _field(1, _features(features))


def records(*payloads):
    return io.BytesIO(b"".join(_frame(p) for p in payloads))


def test_crc32c_matches_the_standard_check_value():
    assert crc32c(b"123456789") == 0xE3069283 and crc32c(b"") == 0
    assert masked_crc32c(b"") == 0xA282EAD8


def test_examples_come_out_as_torchdata_gave_them():
    stream = records(example(label=[3], score=[0.5, 2.0], tags=[b"a", b"b"], big=[-(2**40)]))
    [record] = list(IterableWrapper([("f.tfrecord", stream)]).load_from_tfrecord())
    assert set(record) == {"label", "score", "tags", "big"}
    assert record["tags"] == [b"a", b"b"]
    assert record["label"].dtype == torch.int64 and record["label"].tolist() == [3]
    assert record["score"].dtype == torch.float32 and record["score"].tolist() == [0.5, 2.0]
    assert record["big"].tolist() == [-(2**40)]


def test_a_spec_keeps_reshapes_and_casts():
    stream = records(
        example(pixels=[float(k) for k in range(6)], label=[1], name=[b"x", b"y"], extra=[0])
    )
    spec = {"pixels": ((2, 3), torch.float64), "label": ((), torch.int64), "name": ((2,), None)}
    [record] = list(IterableWrapper([("f", stream)]).load_from_tfrecord(spec))
    assert set(record) == {"pixels", "label", "name"}
    assert record["pixels"].shape == (2, 3) and record["pixels"].dtype == torch.float64
    assert record["label"].shape == () and record["name"] == [b"x", b"y"]
    missing = records(example(label=[1]))
    with pytest.raises(ValueError, match=r"record 0: the record lacks features \['name'"):
        list(
            IterableWrapper([("f", missing)]).load_from_tfrecord(
                {"label": ((), torch.int64), "name": (None, None)}
            )
        )


def test_sequence_examples():
    steps = [_feature([1.0, 2.0]), _feature([3.0, 4.0])]
    lists = _field(1, _field(1, b"frames") + _field(2, b"".join(_field(1, s) for s in steps)))
    payload = _field(1, _features({"n": [2]})) + _field(2, lists)
    [plain] = list(IterableWrapper([("s", records(payload))]).load_from_tfrecord())
    assert plain["n"].tolist() == [2] and [t.tolist() for t in plain["frames"]] == [
        [1.0, 2.0],
        [3.0, 4.0],
    ]
    spec = {"n": ((), torch.int64), "frames": ((-1, 2), torch.float32)}
    [stacked] = list(IterableWrapper([("s", records(payload))]).load_from_tfrecord(spec))
    assert stacked["frames"].shape == (2, 2)


def test_corruption_is_named_with_the_file_and_record():
    good = _frame(example(a=[1]))
    bad_length = bytearray(good * 2)
    bad_length[len(good)] ^= 0xFF
    with pytest.raises(
        ValueError, match=r"'c\.tfrecord', record 1: the length's checksum is wrong"
    ):
        list(IterableWrapper([("c.tfrecord", io.BytesIO(bytes(bad_length)))]).load_from_tfrecord())
    with pytest.raises(ValueError, match="record 0: the file ends inside the record"):
        list(IterableWrapper([("t", io.BytesIO(good[:-6]))]).load_from_tfrecord())
    with pytest.raises(ValueError, match="record 0: the file ends inside a record's length"):
        list(IterableWrapper([("t", io.BytesIO(good[:3]))]).load_from_tfrecord())
    bad_data = bytearray(good)
    bad_data[-5] ^= 0x01  # the value 1 becomes 0: still a valid record
    with pytest.raises(ValueError, match=r"'d', record 0: the data's checksum is wrong"):
        list(IterableWrapper([("d", io.BytesIO(bytes(bad_data)))]).load_from_tfrecord())
    unchecked = IterableWrapper([("d", io.BytesIO(bytes(bad_data)))])
    quiet = list(unchecked.load_from_tfrecord(verify_data=False))
    assert len(quiet) == 1  # verify_data=False: the changed value comes out


def test_arguments_length_and_repr():
    with pytest.raises(TypeError, match="spec must be a dict"):
        IterableWrapper([]).load_from_tfrecord(spec=[("a", None)])
    dp = IterableWrapper([]).load_from_tfrecord({"a": (None, None)}, length=4)
    assert isinstance(dp, TFRecordLoader) and len(dp) == 4
    assert repr(dp) == "TFRecordLoader(spec=['a'], verify_data=True)"
    with pytest.raises(TypeError, match=r"pass load_from_tfrecord\(length=N\)"):
        len(IterableWrapper([]).load_from_tfrecord())
    assert struct.calcsize("<Q") == 8


def test_resume_from_every_step(tmp_path):
    root = make_data(tmp_path)
    check_resume_from_every_step(
        lambda: (
            FileLister(str(root / "tfrecord"))
            .open_files("rb")
            .load_from_tfrecord()
            .map(functools.partial(encode, root=""))
        )  # tensors -> comparable lists
    )


def test_same_output_everywhere(tmp_path):
    root = make_data(tmp_path)
    epochs = check_same_output_everywhere(
        lambda: (
            FileLister(str(root / "tfrecord"), "examples.tfrecord")
            .sharding_filter()
            .open_files("rb")
            .load_from_tfrecord()
            .map(lambda e: e["label"].item())
        )
    )
    assert epochs[0] == [0, 1, 0, 1]
