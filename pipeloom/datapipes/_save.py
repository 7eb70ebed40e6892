"""Write items to files: ``save_to_disk`` (local) and ``save_by_fsspec`` (any fsspec URL)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from typing import IO, Any

from ._base import IterDataPipe
from ._map import check_callable, fn_name

__all__ = ["FSSpecSaver", "Saver"]

_MODES = {"w": "w", "wt": "w", "t": "w", "": "w", "wb": "wb", "b": "wb"}


class Saver(IterDataPipe):
    """Write each ``(path, data)`` to a local file; yield the file's path.

    Functional: ``save_to_disk``. The file is ``filepath_fn(path)`` (or
    ``path``); missing directories are created. Each file is written to a
    temporary name beside it and renamed into place, so a crash never leaves
    a half-written file under the final name. ``data`` is ``bytes`` (mode
    ``"wb"``), ``str`` (mode ``"w"``) or a stream, which is copied and closed.

    Args:
        source: a block yielding ``(path, data)``.
        mode: ``"w"`` (text) or ``"wb"`` (binary); ``"b"`` means ``"wb"``.
        filepath_fn: maps the item's path to the file to write.

    Example:
        >>> import os, tempfile
        >>> from pipeloom.datapipes import IterableWrapper
        >>> root = tempfile.mkdtemp()
        >>> items = IterableWrapper([("1.txt", b"DATA1"), ("sub/2.txt", b"DATA2")])
        >>> saved = items.save_to_disk(mode="wb", filepath_fn=lambda p: os.path.join(root, p))
        >>> [os.path.relpath(p, root) for p in saved]
        ['1.txt', 'sub/2.txt']
        >>> with open(os.path.join(root, "sub/2.txt"), "rb") as file:
        ...     file.read()
        b'DATA2'
    """

    inputs = ("source",)
    per_item = True
    one_to_one = True
    functional_name = "save_to_disk"

    def __init__(
        self,
        source: IterDataPipe,
        mode: str = "w",
        filepath_fn: Callable[[Any], Any] | None = None,
    ) -> None:
        if mode not in _MODES:
            raise ValueError(
                f"{self.functional_name}() mode must be 'w' (text) or 'wb' (binary), got {mode!r}"
            )
        if filepath_fn is not None:
            check_callable(filepath_fn, "filepath_fn", self.functional_name, 1)
        self.source = source
        self.mode = _MODES[mode]
        self.filepath_fn = filepath_fn

    def async_next(self) -> Any:
        item = self.source.async_next()
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(
                f"{self.functional_name}() expects (path, data) items, got {type(item).__name__}"
            )
        path, data = item
        target = path if self.filepath_fn is None else self.filepath_fn(path)
        self._write(target, data)
        return target

    def _write(self, target: Any, data: Any) -> None:
        target = os.fspath(target)
        directory = os.path.dirname(target) or "."
        os.makedirs(directory, exist_ok=True)
        name = f".{os.path.basename(target)}.{os.getpid()}-{uuid.uuid4().hex[:8]}.saving"
        temporary = os.path.join(directory, name)
        try:
            with open(temporary, self.mode.replace("w", "x")) as file:
                write(file, data, target)
            os.replace(temporary, target)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        fn = None if self.filepath_fn is None else fn_name(self.filepath_fn)
        return f"{type(self).__name__}(mode={self.mode!r}, filepath_fn={fn})"


def write(file: IO[Any], data: Any, target: str) -> None:
    """Write ``data`` (bytes, str or a stream, closed after) to ``file``."""
    if hasattr(data, "read"):
        try:
            shutil.copyfileobj(data, file)
        finally:
            data.close()
        return
    try:
        file.write(data)
    except TypeError as error:
        wanted = "bytes (mode='wb')" if "b" in getattr(file, "mode", "") else "str (mode='w')"
        raise TypeError(
            f"cannot write a {type(data).__name__} to {target!r}: the file takes {wanted}; "
            f"pick the mode that matches the data"
        ) from error


class FSSpecSaver(Saver):
    """Write each ``(path, data)`` to an fsspec URL; yield the URL (``save_by_fsspec``).

    Like :class:`Saver`, but the file is opened with fsspec (no temporary
    name: object stores make a file appear whole when it is closed).

    Args:
        source: a block yielding ``(path, data)``.
        mode: ``"w"`` or ``"wb"``.
        filepath_fn: maps the item's path to the URL to write.
        kwargs_for_open: passed to the file system's ``open``.
        **kwargs: storage options for the file system (credentials...).

    Example:
        >>> import fsspec
        >>> from pipeloom.datapipes import IterableWrapper
        >>> items = IterableWrapper([("memory://out/a.txt", "A")])
        >>> list(items.save_by_fsspec())
        ['memory://out/a.txt']
        >>> fsspec.filesystem("memory").cat("/out/a.txt")
        b'A'
    """

    functional_name = "save_by_fsspec"

    def __init__(
        self,
        source: IterDataPipe,
        mode: str = "w",
        filepath_fn: Callable[[Any], Any] | None = None,
        *,
        kwargs_for_open: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        from ._fsspec import _fsspec

        _fsspec("save_by_fsspec")
        super().__init__(source, mode, filepath_fn)
        self.kwargs_for_open = dict(kwargs_for_open or {})
        self.storage_options = kwargs

    def _write(self, target: Any, data: Any) -> None:
        from ._fsspec import _fsspec

        fs, path = _fsspec("save_by_fsspec").core.url_to_fs(str(target), **self.storage_options)
        with fs.open(path, self.mode, **self.kwargs_for_open) as file:
            write(file, data, str(target))
