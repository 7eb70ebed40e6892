"""``routed_decode``: decode ``(path, data)`` items with handlers chosen by extension.

torchdata 0.9's decoder for files: each item's bytes go to the handlers in
order, with the path's extension; the first handler that returns something
other than None decodes the item. The handlers are torch's
(``torch.utils.data.datapipes.utils.decoder``: ``basichandlers``,
``imagehandler("pil")``, ``mathandler()``... or your own ``fn(extension,
data)``), so decoded values are the ones torchdata gave. For WebDataset
samples and pipeloom's decoders by extension, see ``decode()``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ._base import IterDataPipe
from ._context import current_position
from ._map import fn_name, raise_with_note
from ._names import file_name

__all__ = ["RoutedDecoder", "extension_of"]

Handler = Callable[[str, bytes], Any]


def extension_of(path: str) -> str:
    """The extension without its dot: ``"a/b.tar.png"`` -> ``"png"`` (torchdata's ``key_fn``).

    A URL's query and fragment are not part of it: ``"https://h/a.json?sig=x"`` -> ``"json"``.
    """
    return os.path.splitext(file_name(path))[1][1:]


def _default_handlers() -> tuple[Handler, ...]:
    from torch.utils.data.datapipes.utils.decoder import basichandlers, imagehandler

    return (basichandlers, imagehandler("torch"))


class RoutedDecoder(IterDataPipe):
    """Decode each ``(path, data)`` by the first handler that accepts its extension.

    Functional: ``routed_decode``. ``data`` is a binary stream (read whole,
    then closed) or bytes. Without handlers: torch's ``basichandlers``
    (txt, json, cls, pickle, pt...) and ``imagehandler("torch")``. Empty data
    and data no handler accepts pass through as bytes.

    Args:
        source: a block yielding ``(path, stream or bytes)``.
        *handlers: ``fn(extension, data)`` returning the decoded value or None.
        key_fn: path -> the extension given to the handlers.

    Example:
        >>> import io
        >>> from pipeloom.datapipes import IterableWrapper
        >>> files = IterableWrapper([("a.json", io.BytesIO(b'{"x": 1}')), ("b.cls", b"7")])
        >>> list(files.routed_decode())
        [('a.json', {'x': 1}), ('b.cls', 7)]
        >>> upper = lambda ext, data: data.upper() if ext == "txt" else None
        >>> list(IterableWrapper([("n.txt", b"hi")]).routed_decode(upper))
        [('n.txt', b'HI')]
    """

    inputs = ("source",)
    per_item = True
    one_to_one = True

    def __init__(
        self, source: IterDataPipe, *handlers: Handler, key_fn: Callable[[str], str] = extension_of
    ) -> None:
        for handler in handlers:
            if not callable(handler):
                raise TypeError(
                    f"routed_decode() handlers must be callables fn(extension, data), got "
                    f"{type(handler).__name__} {handler!r}"
                )
        if not callable(key_fn):
            raise TypeError(f"key_fn must be a callable path -> extension, got {key_fn!r}")
        self.source = source
        self.handlers = list(handlers) if handlers else list(_default_handlers())
        self.key_fn = key_fn

    def add_handler(self, *handlers: Handler) -> None:
        """Put ``handlers`` before the current ones (torchdata's method)."""
        self.handlers = list(handlers) + self.handlers

    def async_next(self) -> tuple[Any, Any]:
        item = self.source.async_next()
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(
                f"routed_decode() expects (path, stream) items, got {type(item).__name__}; put it "
                f"after open_files(mode='rb') or an archive loader"
            )
        path, data = item
        try:
            return path, self._decode(path if isinstance(path, str) else str(path), data)
        except Exception as error:
            error.add_note(f"while decoding {path!r}")
            raise_with_note(error, self, current_position())
            raise  # pragma: no cover - raise_with_note always raises

    def _decode(self, path: str, data: Any) -> Any:
        if hasattr(data, "read"):
            stream = data
            try:
                data = stream.read()
            finally:
                stream.close()
        if not data:
            return data
        if path.startswith("_") and isinstance(data, bytes):
            return data.decode("utf-8")  # WebDataset-style metadata such as "__key__"
        extension = self.key_fn(path)
        for handler in self.handlers:
            result = handler(extension, data)
            if result is not None:
                return result
        return data

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        names = ", ".join(fn_name(h) for h in self.handlers)
        return f"RoutedDecoder(handlers=[{names}], key_fn={fn_name(self.key_fn)})"
