"""RoutedDecoder (routed_decode): torchdata's decoding by extension."""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pytest
from torch.utils.data.datapipes.utils.decoder import imagehandler

from pipeloom.datapipes import FileLister, IterableWrapper, RoutedDecoder, TarMemberPath
from pipeloom.datapipes._routed_decode import extension_of
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere


def png_bytes():
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.arange(12, dtype=np.uint8).reshape(2, 2, 3)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_default_handlers_decode_text_numbers_json_pickles_and_images():
    pytest.importorskip("PIL")
    items = IterableWrapper(
        [
            ("a.txt", io.BytesIO(b"caf\xc3\xa9")),
            ("a.cls", b"12"),
            ("a.json", b'{"k": [1]}'),
            ("a.pyd", pickle.dumps({"p": 1})),
            ("a.png", png_bytes()),
            ("a.bin", b"raw"),
            ("empty.txt", b""),
            ("__key__", b"sample-1"),
        ]
    )
    out = dict(items.routed_decode())
    assert out["a.txt"] == "café" and out["a.cls"] == 12 and out["a.json"] == {"k": [1]}
    assert out["a.pyd"] == {"p": 1} and out["a.bin"] == b"raw" and out["empty.txt"] == b""
    assert out["__key__"] == "sample-1"
    image = out["a.png"]
    assert tuple(image.shape) == (3, 2, 2) and float(image.max()) <= 1.0  # torch float CHW


def test_handlers_run_in_order_and_add_handler_puts_new_ones_first():
    def shout(extension, data):
        return data.upper() if extension == "txt" else None

    def whisper(extension, data):
        return data.lower()

    dp = IterableWrapper([("x.txt", b"Hi"), ("y.md", b"Yo")]).routed_decode(shout, whisper)
    assert list(dp) == [("x.txt", b"HI"), ("y.md", b"yo")]
    dp.add_handler(lambda extension, data: b"first")
    assert list(dp) == [("x.txt", b"first"), ("y.md", b"first")]
    by_name = IterableWrapper([("x.a.b", b"v")]).routed_decode(
        lambda extension, data: extension, key_fn=lambda path: path.split(".", 1)[1]
    )
    assert list(by_name) == [("x.a.b", "a.b")]


def test_pil_images_with_torchs_handler():
    pytest.importorskip("PIL")
    [(_, image)] = list(
        IterableWrapper([("i.png", png_bytes())]).routed_decode(imagehandler("pil"))
    )
    assert image.size == (2, 2) and image.mode == "RGB"


def test_streams_are_closed_and_errors_name_the_file():
    stream = io.BytesIO(b"{bad")
    with pytest.raises(json.JSONDecodeError) as caught:
        list(IterableWrapper([("broken.json", stream)]).routed_decode())
    assert stream.closed and "while decoding 'broken.json'" in "\n".join(caught.value.__notes__)
    with pytest.raises(TypeError, match=r"handlers must be callables fn\(extension, data\)"):
        IterableWrapper([]).routed_decode("png")
    with pytest.raises(TypeError, match=r"expects \(path, stream\) items, got str"):
        list(IterableWrapper(["a.txt"]).routed_decode())


def test_extension_of_and_repr():
    assert extension_of("d/a.tar.png") == "png" and extension_of("noext") == ""
    assert extension_of("https://h/a.json?sig=x.y#z") == "json"  # a signed URL's query
    assert extension_of("d/a.txt?.json") == "json"  # a local path: '?' is in its name
    items = [("https://h/a.json?sig=a.b", b'{"x": 1}'), (TarMemberPath("s.tar?v=1", "c.cls"), b"7")]
    assert list(IterableWrapper(items).routed_decode()) == [
        (p, v) for p, v in zip([p for p, _ in items], [{"x": 1}, 7])
    ]
    dp = RoutedDecoder(IterableWrapper([]), len)
    assert (
        repr(dp) == "RoutedDecoder(handlers=[len], key_fn=extension_of)"
        and len(IterableWrapper([("a", b"")]).routed_decode()) == 1
    )


@pytest.fixture
def files(tmp_path):
    for index in range(4):
        (tmp_path / f"{index}.json").write_text(json.dumps({"i": index}))
        (tmp_path / f"{index}.txt").write_text(f"text {index}")
    return tmp_path


def test_resume_from_every_step(files):
    check_resume_from_every_step(lambda: FileLister(files).open_files("rb").routed_decode())


def test_same_output_everywhere(files):
    epochs = check_same_output_everywhere(
        lambda: FileLister(files).shuffle().sharding_filter().open_files("rb").routed_decode()
    )
    assert sorted(str(v) for _, v in epochs[0])[:2] == ["text 0", "text 1"]
