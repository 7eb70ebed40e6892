"""Any fsspec file system: list (``FSSpecFileLister``) and open (``FSSpecFileOpener``).

fsspec is an optional extra (``pip install fsspec``, or ``pipeloom[remote]``);
it is imported only when one of these blocks is built.

Example:
    >>> import fsspec
    >>> fs = fsspec.filesystem("memory")
    >>> fs.pipe({"/docs/b.txt": b"B", "/docs/a.txt": b"A", "/docs/c.bin": b"C"})
    >>> files = FSSpecFileLister("memory://docs", masks="*.txt")
    >>> list(files)
    ['memory:///docs/a.txt', 'memory:///docs/b.txt']
    >>> [(p[-5:], s.read()) for p, s in FSSpecFileOpener(files, mode="rb")]
    [('a.txt', b'A'), ('b.txt', b'B')]
"""

from __future__ import annotations

import io
import posixpath
import zlib
from collections.abc import Sequence
from typing import IO, Any

import numpy as np

from ._base import IterDataPipe
from ._files import _MODES, StreamOpener
from ._listers import Lister, _matches

__all__ = ["FSSpecFileLister", "FSSpecFileOpener"]

# What tells one version of a file from another, by file system: the first one present.
_VERSION_KEYS = (
    "ETag",  # s3
    "etag",  # gcs, azure
    "generation",  # gcs
    "mtime",  # local, sftp
    "LastModified",
    "last_modified",
    "updated",
    "modified",
    "created",  # memory
)


def _fsspec(block: str) -> Any:
    try:
        import fsspec
    except ImportError as error:
        raise ImportError(
            f"{block} needs the optional dependency fsspec: pip install fsspec "
            f"(or pip install 'pipeloom[remote]')"
        ) from error
    return fsspec


class FSSpecFileLister(Lister):
    """Yield the sorted paths under ``root`` on any fsspec file system.

    Args:
        root: a URL such as ``"s3://bucket/shards"`` or ``"memory://dir"``.
        masks: glob pattern(s) matched against the file name.
        recursive: also list subdirectories.
        **storage_options: passed to the file system (credentials, endpoint...).

    Raises:
        FileNotFoundError: at first use, naming a root that does not exist.
    """

    def __init__(
        self,
        root: str,
        masks: str | Sequence[str] = "",
        *,
        recursive: bool = False,
        **storage_options: Any,
    ) -> None:
        _fsspec("FSSpecFileLister")
        if not isinstance(root, str) or not root:
            raise TypeError(f"root must be a non-empty URL string, got {root!r}")
        super().__init__(masks)
        self.root = root
        self.recursive = bool(recursive)
        self.storage_options = storage_options

    def _where(self) -> str:
        return repr(self.root)

    def _list(self) -> list[str]:
        fs, path = _fsspec("FSSpecFileLister").core.url_to_fs(self.root, **self.storage_options)
        if not fs.exists(path):
            raise FileNotFoundError(
                f"FSSpecFileLister: root {self.root!r} does not exist on {type(fs).__name__}"
            )
        if fs.isfile(path):
            names = [path]
        elif self.recursive:
            names = fs.find(path)
        else:
            names = [e["name"] for e in fs.ls(path, detail=True) if e["type"] == "file"]
        found = [
            fs.unstrip_protocol(n) for n in names if _matches(posixpath.basename(n), self.masks)
        ]
        return sorted(found)

    def _file_stats(self, paths: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each listed file's size and a CRC-32 of its version as the file system
        reports it (an ETag, a generation, a modification time), from one listing."""
        fs, path = _fsspec("FSSpecFileLister").core.url_to_fs(self.root, **self.storage_options)
        if fs.isfile(path):
            found = {path: fs.info(path)}
        elif self.recursive:
            found = fs.find(path, detail=True)
        else:
            found = {entry["name"]: entry for entry in fs.ls(path, detail=True)}
        infos = {fs.unstrip_protocol(name): info for name, info in found.items()}
        sizes = np.zeros(len(paths), dtype=np.uint64)
        versions = np.zeros(len(paths), dtype=np.uint64)
        for index, url in enumerate(paths):
            info = infos.get(url)
            if info is None:  # gone: 0, 0
                continue
            sizes[index] = int(info.get("size") or 0)
            version = next((info[k] for k in _VERSION_KEYS if info.get(k) is not None), None)
            versions[index] = zlib.crc32(repr(version).encode()) | 1  # never 0: "gone"
        return sizes, versions

    def __repr__(self) -> str:
        return (
            f"FSSpecFileLister(root={self.root!r}, masks={list(self.masks)!r}, "
            f"recursive={self.recursive})"
        )


class FSSpecFileOpener(StreamOpener):
    """Open each fsspec URL; yield ``(url, stream)``. Shardable like :class:`FileOpener`.

    Args:
        source: a block yielding URLs.
        mode: ``"r"`` (text) or ``"rb"`` (binary).
        encoding: text encoding (text mode only; default UTF-8).
        kwargs_for_open: passed to the file system's ``open`` (e.g. an S3
            ``version_id``), as torchdata's ``open_files_by_fsspec`` did.
        **storage_options: options of the file system (credentials...).
    """

    def __init__(
        self,
        source: IterDataPipe,
        mode: str = "r",
        *,
        encoding: str | None = None,
        kwargs_for_open: dict[str, Any] | None = None,
        **storage_options: Any,
    ) -> None:
        _fsspec("FSSpecFileOpener")
        super().__init__(source)
        if mode not in _MODES:
            raise ValueError(f"mode must be one of 'r', 'rt', 'rb', 't', 'b', got {mode!r}")
        self.mode = _MODES[mode]
        if encoding is not None and self.mode == "rb":
            raise ValueError(f"encoding={encoding!r} needs a text mode; use mode='r'")
        self.encoding = encoding
        self.kwargs_for_open = dict(kwargs_for_open or {})
        self.storage_options = storage_options

    def _open(self, path: str) -> IO[Any]:
        fs, inner = _fsspec("FSSpecFileOpener").core.url_to_fs(path, **self.storage_options)
        opened = fs.open(inner, "rb", **self.kwargs_for_open)
        stream: IO[Any] = io.BufferedReader(_RawFile(opened))
        if self.mode == "r":
            stream = io.TextIOWrapper(stream, encoding=self.encoding or "utf-8")  # type: ignore[arg-type]
        return stream

    def __repr__(self) -> str:
        return f"FSSpecFileOpener(mode={self.mode!r}, encoding={self.encoding!r})"


class _RawFile(io.RawIOBase):
    """An fsspec file as a raw stream whose ``closed`` is reliable.

    Some fsspec files (e.g. the memory file system's) ignore ``close()``; the
    opener relies on ``closed`` to know which streams are still being read.
    """

    def __init__(self, file: Any) -> None:
        self._file = file

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._file.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seekable(self) -> bool:
        return bool(self._file.seekable())

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return int(self._file.seek(offset, whence))

    def tell(self) -> int:
        return int(self._file.tell())

    def close(self) -> None:
        if not self.closed:
            try:
                self._file.close()
            finally:
                super().close()
