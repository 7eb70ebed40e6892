"""What a loader's checkpoint records of the files a lister lists, and what changed since.

A checkpoint holds positions: "file 7 of the listing, member 120 of it". A
resume days later lists the directory again and re-opens file 7. If files were
added, removed or renamed, file 7 is another file; if file 7 was rewritten,
appended to or cut, member 120 is another sample. Either way the resumed
epoch would go on, silently, with other data. So the state records:

* the listing: its length and a CRC-32 of its paths (no system call: the
  listing is in memory);
* where a reader resumes in the middle of files (``load_from_tar``,
  ``readlines``, ...), each file's size and modification time, as one 32-bit
  mix per file (local files: a ``stat`` per file, about 3.6 µs on a local
  disk; an fsspec lister passes its own ``stats``: sizes and versions from one
  listing; see docs/storage.md).

A rewrite that keeps both the size and the modification time (a copy that
forges the time, ``touch -r``) cannot be seen; nothing short of reading
every file could.

Example:
    >>> import os, tempfile
    >>> from pipeloom.datapipes._compact import CompactStringList
    >>> path = os.path.join(tempfile.mkdtemp(), "a.txt")
    >>> with open(path, "w") as file:
    ...     _ = file.write("abc")
    >>> paths = CompactStringList([path])
    >>> saved = file_identities(paths)
    >>> with open(path, "a") as file:
    ...     _ = file.write("d")
    >>> changed_files(paths, saved)[0].endswith("a.txt' (now 4 bytes)")
    True
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._compact import CompactStringList

__all__ = [
    "changed_files",
    "changed_strings",
    "describe_listing",
    "describe_strings",
    "ListingMemo",
    "file_identities",
    "local_stats",
]

_MIX = np.uint64(0x9E3779B97F4A7C15)
_SHOWN = 3  # changed files named in a message
_MAX_PATH = 4096


def describe_listing(paths: CompactStringList) -> str:
    """``"N path(s), CRC-32 xxxxxxxx"``: equal listings, equal descriptions."""
    return f"{len(paths)} path(s), CRC-32 {paths.checksum():08x}"


class ListingMemo:
    """The record of one list of strings, kept while the same list (same object, same
    length) is asked again: hashing 1M URLs costs ~110 ms, and a loader may save its
    state at every step. A list changed in place at the same length keeps its old
    record, which a resume then refuses as changed: never the other way round."""

    __slots__ = ("key", "listing")

    def __init__(self) -> None:
        self.key: tuple[int, int] | None = None
        self.listing: str | None = None

    def __reduce__(self) -> tuple[type, tuple[()]]:  # a copy holds another list object
        return ListingMemo, ()


def describe_strings(
    items: Any, *, contents: bool, memo: ListingMemo | None = None
) -> dict[str, str] | None:
    """The record of a source's list of paths or URLs (``IterableWrapper(paths)``):
    like a listing's, the files' sizes and times too with ``contents`` when they are
    local files. None for anything else: a list or tuple whose first item is not a
    local file or a URL (text samples are not hashed at every checkpoint)."""
    if not isinstance(items, (list, tuple)) or not items or not isinstance(items[0], str):
        return None
    local = len(items[0]) < _MAX_PATH and os.path.isfile(items[0])
    if not (local or "://" in items[0][:_MAX_PATH]):
        return None
    key = (id(items), len(items))
    if memo is not None and memo.key == key and memo.listing is not None:
        listing = memo.listing
    else:
        if not all(isinstance(item, str) for item in items):
            return None
        joined = "\0".join(items).encode("utf-8", "surrogateescape")
        listing = f"{len(items)} string(s), CRC-32 {zlib.crc32(joined):08x}"
        if memo is not None:
            memo.key, memo.listing = key, listing
    described = {"listing": listing}
    if contents and local:
        described["files"] = file_identities(items)
    return described


def changed_strings(items: Any, saved: dict[str, Any]) -> list[str]:
    """What changed in a source's list of strings since ``saved`` (``describe_strings``')."""
    now = describe_strings(items, contents=False)
    listing = None if now is None else now["listing"]
    if saved.get("listing") != listing:
        return [
            f"held {saved.get('listing')} when the state was saved, now {listing} (paths "
            f"added, removed, renamed or reordered)"
        ]
    if "files" in saved:
        return changed_files(items, saved["files"])
    return []


Stats = Callable[[Sequence[str]], tuple[np.ndarray, np.ndarray]]


def local_stats(paths: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each local file's size and modification time (ns) as ``uint64`` arrays; 0, 0
    for a file that is gone."""
    sizes = np.zeros(len(paths), dtype=np.uint64)
    times = np.zeros(len(paths), dtype=np.uint64)
    for index, path in enumerate(paths):
        try:
            status = os.stat(path)
        except OSError:  # gone: recorded as size 0, time 0
            continue
        sizes[index] = status.st_size
        times[index] = status.st_mtime_ns
    return sizes, times


def _mix(sizes: np.ndarray, times: np.ndarray) -> np.ndarray:
    mixed = (sizes * _MIX) ^ times  # wraps modulo 2**64, as meant
    return (mixed ^ (mixed >> np.uint64(32))).astype(np.uint32)


def file_identities(paths: Sequence[str], stats: Stats = local_stats) -> str:
    """Each file's size and modification time mixed into 32 bits, as hex (8 per file)."""
    return _mix(*stats(paths)).astype(">u4").tobytes().hex()


def changed_files(paths: Sequence[str], saved: str, stats: Stats = local_stats) -> list[str]:
    """The files of ``paths`` whose identity is not the one in ``saved``; empty when none.

    One line saying how many, naming the first few with their size now.
    """
    sizes, times = stats(paths)
    now = _mix(sizes, times)
    try:
        was = np.frombuffer(bytes.fromhex(saved), dtype=">u4").astype(np.uint32)
    except (TypeError, ValueError):
        was = None
    if was is None or len(was) != len(now):
        return ["the state's record of the files' sizes and times is damaged"]
    changed = np.flatnonzero(was != now)
    if not len(changed):
        return []
    named = ", ".join(
        f"{paths[int(i)]!r} (now {int(sizes[i])} bytes)"
        if times[i]
        else f"{paths[int(i)]!r} (now missing)"
        for i in changed[:_SHOWN]
    )
    more = f" and {len(changed) - _SHOWN} more" if len(changed) > _SHOWN else ""
    return [
        f"{len(changed)} of {len(now)} file(s) were rewritten, appended to or cut "
        f"(their size or modification time changed): {named}{more}"
    ]
