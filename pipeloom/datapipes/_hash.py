"""``check_hash``: verify each file's digest before it is used."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from typing import Any

from ._base import IterDataPipe

__all__ = ["HashChecker"]

_READ_SIZE = 1 << 20


class HashChecker(IterDataPipe):
    """Check the digest of each ``(path, data)``; yield the item, ready to read.

    Functional: ``check_hash``. ``data`` is bytes, str (hashed as UTF-8) or a
    stream. A stream is hashed while it is read; with ``rewind`` it is then
    handed on from its start (a stream that cannot seek, such as an HTTP
    response, is kept in memory for that).

    Args:
        source: a block yielding ``(path, data)``.
        hash_dict: the expected hex digest of each path.
        hash_type: a ``hashlib`` algorithm: ``"sha256"`` (default), ``"md5"``,
            ``"sha1"``, ``"blake2b"``...
        rewind: hand a stream on from its start (else it is left at its end).

    Raises (while iterating):
        KeyError: a path missing from ``hash_dict``.
        ValueError: a digest that differs, with both digests.

    Example:
        >>> import hashlib, io
        >>> from pipeloom.datapipes import IterableWrapper
        >>> digest = hashlib.md5(b"payload").hexdigest()
        >>> files = IterableWrapper([("f.bin", io.BytesIO(b"payload"))])
        >>> [(p, s.read()) for p, s in files.check_hash({"f.bin": digest}, "md5")]
        [('f.bin', b'payload')]
    """

    inputs = ("source",)
    per_item = True
    one_to_one = True

    def __init__(
        self,
        source: IterDataPipe,
        hash_dict: Mapping[str, str],
        hash_type: str = "sha256",
        rewind: bool = True,
    ) -> None:
        if not isinstance(hash_dict, Mapping):
            raise TypeError(
                f"hash_dict must map each path to its hex digest, got {type(hash_dict).__name__}"
            )
        if not isinstance(hash_type, str) or hash_type.lower() not in hashlib.algorithms_available:
            raise ValueError(
                f"hash_type must be a hashlib algorithm such as 'sha256' or 'md5', got "
                f"{hash_type!r}"
            )
        if not isinstance(rewind, bool):
            raise TypeError(f"rewind must be True or False, got {rewind!r}")
        self.source = source
        self.hash_dict = dict(hash_dict)
        self.hash_type = hash_type.lower()
        self.rewind = rewind

    def async_next(self) -> tuple[str, Any]:
        item = self.source.async_next()
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(
                f"check_hash() expects (path, data) items, got {type(item).__name__}; put it "
                f"after open_files(mode='rb') or an HTTP opener"
            )
        path, data = item
        if path not in self.hash_dict:
            raise KeyError(
                f"check_hash(): no expected digest for {path!r} in hash_dict (it has "
                f"{len(self.hash_dict)} paths); add it, or filter the path out before"
            )
        digest = hashlib.new(self.hash_type)
        if isinstance(data, (bytes, bytearray, str)):
            digest.update(data.encode() if isinstance(data, str) else data)
        else:
            data = self._hash_stream(data, digest)
        expected = self.hash_dict[path]
        if digest.hexdigest() != expected.lower():
            raise ValueError(
                f"check_hash(): the {self.hash_type} digest of {path!r} is "
                f"{digest.hexdigest()}, expected {expected}; the file is corrupted or "
                f"incomplete: delete it and download it again"
            )
        return path, data

    def _hash_stream(self, stream: Any, digest: Any) -> Any:
        keep = None
        if self.rewind and not _seekable(stream):
            keep = io.BytesIO()
        while True:
            chunk = stream.read(_READ_SIZE)
            if not chunk:
                break
            data = chunk.encode() if isinstance(chunk, str) else chunk
            digest.update(data)
            if keep is not None:
                keep.write(data)
        if keep is not None:
            stream.close()
            keep.seek(0)
            return keep
        if self.rewind:
            stream.seek(0)
        return stream

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return (
            f"HashChecker(hash_type={self.hash_type!r}, rewind={self.rewind}, "
            f"paths={len(self.hash_dict)})"
        )


def _seekable(stream: Any) -> bool:
    try:
        return bool(stream.seekable())
    except (AttributeError, ValueError):
        return False
