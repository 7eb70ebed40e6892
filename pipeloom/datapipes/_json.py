"""``parse_json_files``: one parsed JSON document per ``(path, stream)``."""

from __future__ import annotations

import json
from typing import Any

from ._base import IterDataPipe
from ._context import current_position
from ._map import raise_with_note

__all__ = ["JsonParser"]


class JsonParser(IterDataPipe):
    """Read each ``(path, stream)`` whole and yield ``(path, json.loads(text))``.

    Functional: ``parse_json_files``. The stream is closed once read. A
    ``(path, bytes)`` item (e.g. a tar member) is parsed directly. For JSON
    *lines* (one document per line), use ``readlines(return_path=False).map(json.loads)``.

    Args:
        source: a block yielding ``(path, stream)`` or ``(path, bytes)``.
        **kwargs: passed to ``json.loads`` (``object_hook``, ``parse_float``...).

    Raises (while iterating):
        json.JSONDecodeError: with a note naming the file.

    Example:
        >>> import io
        >>> from pipeloom.datapipes import IterableWrapper
        >>> files = IterableWrapper([("a.json", io.StringIO('{"x": [1, 2]}'))])
        >>> list(files.parse_json_files())
        [('a.json', {'x': [1, 2]})]
    """

    inputs = ("source",)
    per_item = True
    one_to_one = True

    def __init__(self, source: IterDataPipe, **kwargs: Any) -> None:
        try:
            json.loads("0", **kwargs)
        except TypeError as error:
            raise TypeError(
                f"parse_json_files() passes its keyword arguments to json.loads, which "
                f"rejects {sorted(kwargs)}: {error}"
            ) from None
        self.source = source
        self.kwargs = kwargs

    def async_next(self) -> tuple[Any, Any]:
        item = self.source.async_next()
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(
                f"parse_json_files() expects (path, stream) items, got "
                f"{type(item).__name__}; put it after open_files() or an archive loader"
            )
        path, data = item
        if hasattr(data, "read"):
            try:
                text = data.read()
            finally:
                data.close()
        elif isinstance(data, (str, bytes, bytearray)):
            text = data
        else:
            raise TypeError(
                f"parse_json_files() expects a stream or bytes for {path!r}, got "
                f"{type(data).__name__}"
            )
        try:
            return path, json.loads(text, **self.kwargs)
        except Exception as error:
            error.add_note(f"while parsing the JSON file {path!r}")
            raise_with_note(error, self, current_position())
            raise  # pragma: no cover - raise_with_note always raises

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        extra = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"JsonParser({extra})"
