"""Decoder: bytes to values by extension, per-block decoders, strict mode."""

from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest
import torch

from pipeloom.datapipes import Decoder, IterableWrapper, default_decoders
from pipeloom.testing import check_resume_from_every_step, collect, collect_async


def npy_bytes(array):
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def pt_bytes(value):
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def decode(items, **kwargs):
    return collect(Decoder(IterableWrapper(items), **kwargs))


def test_default_decoders_by_extension():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    items = [
        ("d/x.npy", npy_bytes(array)),
        ("d/x.json", json.dumps({"a": [1]}).encode()),
        ("d/x.txt", "héllo".encode()),
        ("d/x.cls", b" 7\n"),
        ("d/x.idx", b"12"),
        ("d/x.pt", pt_bytes({"w": torch.ones(2)})),
    ]
    out = dict(decode(items))
    np.testing.assert_array_equal(out["d/x.npy"], array)
    assert out["d/x.json"] == {"a": [1]} and out["d/x.txt"] == "héllo"
    assert out["d/x.cls"] == 7 and out["d/x.idx"] == 12
    assert torch.equal(out["d/x.pt"]["w"], torch.ones(2))


def test_a_signed_urls_query_is_not_part_of_the_extension():
    items = [("https://h/x.json?sig=a.b&e=1", b'{"a": 1}'), ("https://h/y.cls#f.g", b"7")]
    assert decode(items) == [(items[0][0], {"a": 1}), (items[1][0], 7)]


def test_pt_files_are_loaded_with_weights_only():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with pytest.raises(ValueError, match=r"decoding 'x.pt' with the '.pt' decoder .* failed"):
        decode([("x.pt", pt_bytes(Evil()))])


def test_images_decode_to_rgb_uint8_chw_tensors():
    image_module = pytest.importorskip("PIL.Image", reason="Pillow is an optional extra")
    buffer = io.BytesIO()
    image_module.new("L", (5, 3), color=200).save(buffer, format="PNG")
    [(name, tensor)] = decode([("img.PNG", buffer.getvalue())])
    assert tensor.dtype == torch.uint8 and tensor.shape == (3, 3, 5)
    assert int(tensor[0, 0, 0]) == 200


def test_images_without_pillow_pass_through_or_raise_in_strict_mode(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    assert decode([("a.jpg", b"raw")]) == [("a.jpg", b"raw")]
    with pytest.raises(ImportError, match="pip install Pillow"):
        decode([("a.jpg", b"raw")], strict=True)


def test_sample_dicts_have_each_field_decoded_by_its_name_and_metadata_left_alone():
    sample = {
        "__key__": "s/0001",
        "__url__": "s.tar",
        "__local_path__": "s.tar",
        "cls": b"3",
        "seg.txt": b"t",
        "meta": b"m",
    }
    assert decode([sample]) == [
        {
            "__key__": "s/0001",
            "__url__": "s.tar",
            "__local_path__": "s.tar",
            "cls": 3,
            "seg.txt": "t",
            "meta": b"m",  # no decoder: passed through
        }
    ]
    assert decode([{"__key__": "k", ".cls": b"4"}]) == [{"__key__": "k", ".cls": 4}]  # dotted too


def test_streams_are_read_and_closed():
    stream = io.BytesIO(b"5")
    assert decode([("n.cls", stream)]) == [("n.cls", 5)] and stream.closed


def test_unknown_extension_passes_through_unless_strict():
    assert decode([("a.foo", b"?"), ("noext", b"!")]) == [("a.foo", b"?"), ("noext", b"!")]
    with pytest.raises(
        ValueError, match=r"no decoder for extension '.foo' of 'dir/a.foo'.*decoders=\{'.foo': fn\}"
    ):
        decode([("dir/a.foo", b"?")], strict=True)
    with pytest.raises(ValueError, match=r"no decoder for extension '.bar' of 'd/s.tar/1.bar'"):
        decode([{"__key__": "1", "__url__": "d/s.tar", "bar": b""}], strict=True)


def test_custom_decoders_add_and_override_per_block():
    items = [("a.foo", b"abc"), ("a.cls", b"1")]
    assert decode(items, decoders={".foo": bytes.upper, ".CLS": lambda b: -int(b)}) == [
        ("a.foo", b"ABC"),
        ("a.cls", -1),
    ]
    assert decode(items, decoders={".cls": None}) == items  # opt out of a default
    assert decode(items, decoders={"foo": len, "cls": None}) == [("a.foo", 3), ("a.cls", b"1")]
    assert decode(items) == [("a.foo", b"abc"), ("a.cls", 1)]  # no global state


def test_full_extension_wins_over_its_last_part():
    assert decode([("x.seg.txt", b"s")], decoders={".seg.txt": len}) == [("x.seg.txt", 1)]
    assert decode([("x.seg.txt", b"s")]) == [("x.seg.txt", "s")]


def test_default_decoders_returns_a_fresh_dict():
    decoders = default_decoders()
    decoders[".cls"] = str
    assert default_decoders()[".cls"] is not str


def test_decoder_failure_names_the_item_and_decoder():
    with pytest.raises(
        ValueError, match=r"decoding 'k.cls' with the '.cls' decoder _int failed: ValueError"
    ):
        decode([("k.cls", b"not a number")])


def test_bad_arguments_and_items_are_rejected():
    source = IterableWrapper([])
    for bad in ("", ".", "..foo"):
        with pytest.raises(ValueError, match=rf"extensions like '.foo' or 'foo', got '{bad}'"):
            Decoder(source, decoders={bad: len})
    with pytest.raises(TypeError, match="the decoder for '.foo' must be callable"):
        Decoder(source, decoders={".foo": 3})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match=r"expects \(name, bytes\) tuples or sample dicts, got int"):
        decode([3])
    assert (
        repr(Decoder(source, decoders={".foo": len})) == "Decoder(strict=False, decoders=['.foo'])"
    )


def test_stateless_resume_and_async_path():
    items = [(f"{i}.cls", str(i).encode()) for i in range(5)]
    check_resume_from_every_step(lambda: Decoder(IterableWrapper(items)))
    assert collect_async(Decoder(IterableWrapper(items))) == [(f"{i}.cls", i) for i in range(5)]


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
        np.zeros((0, 3)),
        np.array(5.0),
        np.array([True, False]),
        np.arange(4, dtype=">i4"),
    ],
    ids=["c-order", "fortran", "empty", "0-d", "bool", "big-endian"],
)
def test_npy_fast_path_equals_np_load_and_is_writable(array):
    import io

    from pipeloom.datapipes._decode import _npy

    buffer = io.BytesIO()
    np.save(buffer, array)
    decoded = _npy(buffer.getvalue())
    expected = np.load(io.BytesIO(buffer.getvalue()))
    assert decoded.dtype == expected.dtype and decoded.shape == expected.shape
    assert np.array_equal(decoded, expected) and decoded.flags.writeable
    assert decoded.flags.f_contiguous == expected.flags.f_contiguous


def test_npy_with_pickled_objects_is_refused():
    import io

    from pipeloom.datapipes._decode import _npy

    buffer = io.BytesIO()
    np.save(buffer, np.array([{1: 2}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle=False"):
        _npy(buffer.getvalue())


@pytest.mark.timeout(60)
def test_npy_headers_decode_correctly_from_many_threads_at_once():
    # CPython 3.11's ast parser is not safe to run in two threads at once; worker
    # threads decoding .npy files must not hit "AST constructor recursion depth mismatch".
    from concurrent.futures import ThreadPoolExecutor

    from pipeloom.datapipes._decode import _parse_npy_header

    arrays = [np.arange(n, dtype=dtype) for n in range(1, 40) for dtype in ("<i4", "<f8")]
    payloads = [npy_bytes(a) for a in arrays]
    _parse_npy_header.cache_clear()
    decode_npy = default_decoders()[".npy"]
    with ThreadPoolExecutor(8) as pool:
        decoded = list(pool.map(decode_npy, payloads * 4))
    for got, expected in zip(decoded, arrays * 4):
        np.testing.assert_array_equal(got, expected)
