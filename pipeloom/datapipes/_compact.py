"""A compact, immutable list of strings that forked workers can read for free.

A Python ``list`` of ``str`` holds one object per element. Every read in a
forked worker bumps that object's reference count, which writes to its memory
page, so the page is copied into the worker ("copy-on-access"): a list of
millions of paths ends up duplicated in every worker. :class:`CompactStringList`
stores all strings in one ``uint8`` NumPy buffer plus an ``int64`` offsets
array — two objects in total — and builds each ``str`` only when it is read.

Example:
    >>> names = CompactStringList(["a.tar", "b.tar", "ünï.tar"])
    >>> len(names), names[2], names[-1] == names[2]
    (3, 'ünï.tar', True)
    >>> list(names[:2])
    ['a.tar', 'b.tar']
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import numpy as np

__all__ = ["CompactStringList"]


class CompactStringList(Sequence[str]):
    """An immutable sequence of ``str`` kept in two NumPy arrays.

    Args:
        strings: the strings to store, in order.
    """

    __slots__ = ("_data", "_offsets")

    def __init__(self, strings: Iterable[str] = ()) -> None:
        encoded = []
        for index, text in enumerate(strings):
            if not isinstance(text, str):
                raise TypeError(
                    f"CompactStringList stores str only; element {index} is "
                    f"{type(text).__name__} {text!r}; convert it with str() or os.fsdecode()"
                )
            encoded.append(text.encode("utf-8", "surrogateescape"))
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(
            np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:]
        )
        data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        data.flags.writeable = False
        offsets.flags.writeable = False
        self._data = data
        self._offsets = offsets

    @property
    def nbytes(self) -> int:
        """Bytes used by the two arrays (the whole storage)."""
        return int(self._data.nbytes + self._offsets.nbytes)

    def checksum(self) -> int:
        """A CRC-32 of the strings and their boundaries (equal lists, equal checksums).

        Example:
            >>> a, b = CompactStringList(["ab", "c"]), CompactStringList(["a", "bc"])
            >>> a.checksum() == b.checksum()
            False
        """
        offsets = np.ascontiguousarray(self._offsets, dtype="<i8")  # the same on every machine
        return zlib.crc32(self._data.data, zlib.crc32(offsets.data))

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> CompactStringList: ...

    def __getitem__(self, index: int | slice) -> str | CompactStringList:
        if isinstance(index, slice):
            return CompactStringList([self[i] for i in range(*index.indices(len(self)))])
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(
                f"CompactStringList indices must be int or slice, got {type(index).__name__}"
            )
        size = len(self)
        position = int(index) + size if index < 0 else int(index)
        if not 0 <= position < size:
            raise IndexError(f"index {index} is out of range for {size} strings")
        start, stop = self._offsets[position], self._offsets[position + 1]
        return self._data[start:stop].tobytes().decode("utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        for position in range(len(self)):
            yield self[position]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CompactStringList):
            return np.array_equal(self._offsets, other._offsets) and np.array_equal(
                self._data, other._data
            )
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> tuple[np.ndarray, np.ndarray]:
        return self._data, self._offsets

    def __setstate__(self, state: tuple[np.ndarray, np.ndarray]) -> None:
        data, offsets = state
        data.flags.writeable = False
        offsets.flags.writeable = False
        self._data, self._offsets = data, offsets

    def __repr__(self) -> str:
        shown = ", ".join(repr(s) for s in self[:3])
        more = ", ..." if len(self) > 3 else ""
        return f"CompactStringList([{shown}{more}], len={len(self)})"
