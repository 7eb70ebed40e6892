"""What a loader's checkpoint records of the files a lister lists, and what changed since.

A checkpoint holds positions: "file 7 of the listing, member 120 of it". A
resume days later lists the directory again and re-opens file 7. If files were
added, removed or renamed, file 7 is another file; if file 7 was rewritten,
appended to or cut, member 120 is another sample. Either way the resumed
epoch would go on, silently, with other data. So the state records:

* the listing: its length and a CRC-32 of its paths (no system call: the
  listing is in memory);
* where a reader resumes in the middle of files (``load_from_tar``,
  ``readlines``, ...), each local file's size and modification time, as one
  32-bit mix per file (a ``stat`` per file, about 2 µs on a local disk; see
  docs/storage.md).

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

import numpy as np

from ._compact import CompactStringList

__all__ = ["changed_files", "describe_listing", "file_identities"]

_MIX = np.uint64(0x9E3779B97F4A7C15)
_SHOWN = 3  # changed files named in a message


def describe_listing(paths: CompactStringList) -> str:
    """``"N path(s), CRC-32 xxxxxxxx"``: equal listings, equal descriptions."""
    return f"{len(paths)} path(s), CRC-32 {paths.checksum():08x}"


def _stats(paths: CompactStringList) -> tuple[np.ndarray, np.ndarray]:
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


def file_identities(paths: CompactStringList) -> str:
    """Each file's size and modification time mixed into 32 bits, as hex (8 per file)."""
    return _mix(*_stats(paths)).astype(">u4").tobytes().hex()


def changed_files(paths: CompactStringList, saved: str) -> list[str]:
    """The files of ``paths`` whose identity is not the one in ``saved``; empty when none.

    One line saying how many, naming the first few with their size now.
    """
    sizes, times = _stats(paths)
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
