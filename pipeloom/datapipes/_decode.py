"""Decode raw bytes by file extension (``decode``).

Works on ``(name, bytes)`` items (e.g. from ``load_from_tar``) and on
WebDataset sample dicts (every field is decoded by its name as the extension,
``"jpg"`` by the ``.jpg`` decoder; the ``__key__``, ``__url__`` and other
``__meta__`` fields are left alone). A value may also be a binary stream; it
is read and closed.

The decoders are an argument, not global state: start from
:func:`default_decoders` and override or add extensions with
``decode(decoders={".foo": fn})`` (the leading dot may be left out). An
extension is looked up in full first (``".seg.png"``), then by its last part
(``".png"``).

Default decoders: ``.npy`` (NumPy array), ``.json``, ``.txt`` (str),
``.cls``/``.idx`` (int), ``.pt`` (``torch.load(weights_only=True)``) and, when
Pillow is installed, images (``.jpg .jpeg .png .ppm .pgm .bmp .gif .tif .tiff
.webp``) as RGB ``uint8`` tensors of shape ``(3, H, W)``.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> items = IterableWrapper([("a.json", b'{"x": 1}'), ("a.cls", b"7"), ("a.bin", b"?")])
    >>> list(Decoder(items))
    [('a.json', {'x': 1}), ('a.cls', 7), ('a.bin', b'?')]
    >>> list(Decoder(items, decoders={".bin": len}))[-1]
    ('a.bin', 1)
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import StateError
from ._base import IterDataPipe
from ._names import file_name
from ._npy import literal as _literal
from ._npy import load as _load

__all__ = ["Decoder", "default_decoders", "IMAGE_EXTENSIONS"]

IMAGE_EXTENSIONS = (
    ".jpg",
    ".jpeg",
    ".png",
    ".ppm",
    ".pgm",
    ".bmp",
    ".gif",
    ".tif",
    ".tiff",
    ".webp",
)


def _npy(data: bytes) -> np.ndarray:
    """Decode ``.npy`` bytes (no pickles) into a fresh, writable array.

    The header -- a small Python literal that ``np.load`` parses with
    ``ast`` on every call -- is parsed once per distinct header and cached;
    the payload is then one copy out of ``data``.
    """
    layout = _npy_layout(data)
    if layout is None:  # unusual file: let NumPy handle (and explain) it
        stream = io.BytesIO(data)
        array = _load(stream, allow_pickle=False)
        _check_npy_end(len(data) - stream.tell(), array.dtype, array.shape)
        return array
    offset, dtype, shape, fortran = layout
    count = int(np.prod(shape, dtype=np.int64))
    _check_npy_end(len(data) - offset - count * dtype.itemsize, dtype, shape)
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    if fortran:
        return flat.reshape(shape[::-1]).transpose().copy(order="F")
    return flat.reshape(shape).copy()


_NPY_MAGIC = b"\x93NUMPY"


def _check_npy_end(extra: int, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """Raise when bytes follow the array: ``np.load`` would drop them silently."""
    if extra:
        raise ValueError(
            f"{extra} byte(s) follow the array (shape {shape}, dtype {dtype}): a .npy file "
            f"holds one array, so its header (shape or dtype) or its length is damaged, or "
            f"several arrays were saved into it; save one array per .npy (or use .npz)"
        )


@functools.lru_cache(maxsize=256)
def _parse_npy_header(
    header: bytes, encoding: str = "latin1"
) -> tuple[np.dtype, tuple[int, ...], bool] | None:
    try:
        fields = _literal(header.decode(encoding))
        dtype = np.dtype(np.lib.format.descr_to_dtype(fields["descr"]))
        shape, fortran = tuple(int(n) for n in fields["shape"]), bool(fields["fortran_order"])
    except (ValueError, SyntaxError, KeyError, TypeError):
        return None
    return None if dtype.hasobject else (dtype, shape, fortran)


def _npy_layout(data: bytes) -> tuple[int, np.dtype, tuple[int, ...], bool] | None:
    if data[:6] != _NPY_MAGIC or len(data) < 10:
        return None
    major = data[6]
    if major == 1:
        start, size = 10, int.from_bytes(data[8:10], "little")
    elif major in (2, 3):
        start, size = 12, int.from_bytes(data[8:12], "little")
    else:
        return None
    # Version 3 is version 2 with a UTF-8 header (NumPy writes it for unicode field names).
    encoding = "utf-8" if major == 3 else "latin1"
    parsed = _parse_npy_header(bytes(data[start : start + size]), encoding)
    if parsed is None:
        return None
    dtype, shape, fortran = parsed
    offset = start + size
    if len(data) - offset < dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
        return None  # truncated: np.load raises a clear error
    return offset, dtype, shape, fortran


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _int(data: bytes) -> int:
    return int(data.decode("ascii").strip())


def _torch(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


def _image(data: bytes) -> Any:
    """Decode an image to an RGB uint8 tensor (3, H, W); needs Pillow."""
    try:
        from PIL import Image
    except ImportError as error:
        raise ImportError(
            "decoding images needs Pillow: pip install Pillow (or pipeloom[images])"
        ) from error
    import torch

    with Image.open(io.BytesIO(data)) as image:
        array = np.asarray(image.convert("RGB"))
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


def default_decoders() -> dict[str, Callable[[bytes], Any]]:
    """A fresh dict of the built-in decoders, keyed by extension (``".npy"``...).

    >>> sorted(default_decoders())[:4]
    ['.bmp', '.cls', '.gif', '.idx']
    """
    decoders: dict[str, Callable[[bytes], Any]] = {
        ".npy": _npy,
        ".json": json.loads,
        ".txt": _text,
        ".cls": _int,
        ".idx": _int,
        ".pt": _torch,
    }
    decoders.update(dict.fromkeys(IMAGE_EXTENSIONS, _image))
    return decoders


def _has_pillow() -> bool:
    try:
        import PIL  # noqa: F401
    except ImportError:
        return False
    return True


def _dotted(extension: str) -> str:
    return extension if extension.startswith(".") else "." + extension


def _is_meta(name: Any) -> bool:
    """``__key__``, ``__url__``, ``__local_path__``...: not data to decode."""
    return not isinstance(name, str) or name.startswith("__")


class Decoder(IterDataPipe):
    """Decode ``(name, bytes)`` items or sample dicts by extension. Functional: ``decode``.

    Args:
        source: a block yielding ``(name, bytes)`` or sample dicts (``webdataset()``).
        strict: raise on an extension with no decoder (and on images when
            Pillow is missing) instead of passing the value through unchanged.
        decoders: extra or overriding decoders, ``{".ext": fn(bytes) -> value}``
            (``"ext"`` works too); map an extension to ``None`` to leave it
            undecoded.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> sample = {"__key__": "0001", "__url__": "s.tar", "cls": b"3", "seg.txt": b"t"}
        >>> list(Decoder(IterableWrapper([sample]), decoders={"txt": bytes.upper}))
        [{'__key__': '0001', '__url__': 's.tar', 'cls': 3, 'seg.txt': b'T'}]
    """

    per_item = True
    one_to_one = True

    inputs = ("source",)

    def __init__(
        self,
        source: IterDataPipe,
        *,
        strict: bool = False,
        decoders: Mapping[str, Callable[[bytes], Any] | None] | None = None,
    ) -> None:
        if not isinstance(source, IterDataPipe):
            raise TypeError(f"Decoder expects an IterDataPipe, got {type(source).__name__}")
        if decoders is not None and not isinstance(decoders, Mapping):
            raise TypeError(f"decoders must be a dict {{'.ext': fn}}, got {decoders!r}")
        for extension, fn in (decoders or {}).items():
            if not isinstance(extension, str) or not extension.lstrip(".") or ".." in extension:
                raise ValueError(
                    f"decoder keys are extensions like '.foo' or 'foo', got {extension!r}"
                )
            if fn is not None and not callable(fn):
                raise TypeError(f"the decoder for {extension!r} must be callable, got {fn!r}")
        self.source = source
        self.strict = bool(strict)
        self.decoders = {_dotted(k.lower()): v for k, v in (decoders or {}).items()}
        table: dict[str, Any] = dict(default_decoders())
        if not _has_pillow() and not self.strict:
            for extension in IMAGE_EXTENSIONS:
                del table[extension]  # images pass through undecoded
        table.update(self.decoders)
        self._table = table

    def async_next(self) -> Any:
        item = self.source.async_next()
        if isinstance(item, dict):
            where = f"{item.get('__url__', '?')}/{item.get('__key__', '?')}."
            return {
                name: value
                if _is_meta(name)
                else self._decode(_dotted(name), value, where + name.lstrip("."))
                for name, value in item.items()
            }
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            name = item[0]
            base = file_name(name)  # a signed URL's query is not part of its extension
            extension = "." + base.partition(".")[2] if "." in base else ""
            return name, self._decode(extension, item[1], name)
        raise TypeError(
            f"Decoder expects (name, bytes) tuples or sample dicts, got "
            f"{type(item).__name__} {item!r:.80}"
        )

    def _decode(self, extension: str, value: Any, where: str) -> Any:
        extension = extension.lower()
        fn = self._table.get(extension, ...)
        if fn is ... and extension:
            fn = self._table.get("." + extension.rsplit(".", 1)[-1], ...)
        if fn is ...:
            if self.strict:
                raise ValueError(
                    f"no decoder for extension {extension or '(none)'!r} of {where!r}; "
                    f"register one with .decode(decoders={{{extension or '.ext'!r}: fn}}), or "
                    f"pass strict=False to pass such values through unchanged"
                )
            return value
        if fn is None:
            return value
        if hasattr(value, "read"):
            with value:
                value = value.read()
        try:
            return fn(value)
        except ImportError:
            raise
        except Exception as error:
            raise ValueError(
                f"decoding {where!r} with the {extension!r} decoder "
                f"{getattr(fn, '__qualname__', fn)} failed: {type(error).__name__}: {error}"
            ) from error

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state != {}:
            raise StateError(f"{self!r} keeps no state, but got {state!r:.100}")

    def __repr__(self) -> str:
        return f"Decoder(strict={self.strict}, decoders={sorted(self.decoders)!r})"
