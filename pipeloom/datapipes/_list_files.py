"""``list_files`` / ``list_files_by_fsspec``: the files under each root of a stream."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from ._base import IterDataPipe
from ._compact import CompactStringList
from ._expand import Expander
from ._listers import FileLister
from ._sharding import ShardingFilter
from ._shuffle import Shuffler
from ._wrappers import IterableWrapper

__all__ = ["FSSpecRootLister", "RootLister"]

SETTLED_NS = 2_000_000_000
"""A directory changed less than this long ago may change again within the same tick of
its modification time, unseen: its listing is not kept for the next checkpoint."""

# Why a resume cannot check what list_files over a stream lists (docs/storage.md).
_UNCHECKED = (
    "lists the files under each root as the root arrives, so the state records no listing: "
    "files added, removed or renamed since the state was saved under the root being read "
    "are skipped or repeated without a word"
)


def fixed_roots(source: IterDataPipe) -> list[str] | None:
    """The roots ``source`` yields when they are a fixed list of paths (an
    ``IterableWrapper`` of a list or tuple, maybe shuffled or sharded); None for
    any other stream (a block that makes or changes roots)."""
    while isinstance(source, (ShardingFilter, Shuffler)):
        source = source.source
    if not isinstance(source, IterableWrapper):
        return None
    roots = source.iterable
    if not isinstance(roots, (list, tuple)) or not roots:
        return None
    if not all(isinstance(root, (str, os.PathLike)) for root in roots):
        return None
    return [os.fspath(root) for root in roots]


class RootLister(Expander):
    """Yield the files under each incoming root, sorted per root (functional: ``list_files``).

    Each root is listed when it arrives, with the rules of :class:`FileLister`
    (a root that is a file is yielded if it matches). Use :class:`FileLister`
    when the roots are known up front: it lists once and stores the paths
    compactly. A checkpoint records the files under a fixed list of roots
    (an ``IterableWrapper`` of them, maybe shuffled or sharded) as
    ``FileLister(roots)`` would, and a resume refuses them changed; over any
    other stream it records none, and ``load_state_dict`` warns that it cannot
    check them (docs/storage.md, "Files that changed before the resume").

    Args:
        source: a block yielding root paths (directories or files).
        masks: glob pattern(s) matched against file names; empty matches all.
        recursive: also list subdirectories.
        abspath: yield absolute paths.
        non_deterministic: keep the file system's order instead of sorting.
        length: the value of ``len()`` (``-1``: no length), as in torchdata.

    Raises (while iterating):
        FileNotFoundError: a root that does not exist, named.

    Example:
        >>> import os, tempfile
        >>> from pipeloom.datapipes import IterableWrapper
        >>> a, b = tempfile.mkdtemp(), tempfile.mkdtemp()
        >>> for root, name in ((a, "x.txt"), (b, "y.txt"), (b, "z.bin")):
        ...     open(os.path.join(root, name), "w").close()
        >>> [os.path.basename(p) for p in IterableWrapper([a, b]).list_files(masks="*.txt")]
        ['x.txt', 'y.txt']
    """

    def __init__(
        self,
        source: IterDataPipe,
        masks: str | Sequence[str] = "",
        *,
        recursive: bool = False,
        abspath: bool = False,
        non_deterministic: bool = False,
        length: int = -1,
    ) -> None:
        super().__init__(source)
        checked = FileLister(  # validates the arguments; lists nothing
            ".", masks, recursive=recursive, abspath=abspath, non_deterministic=non_deterministic
        )
        if isinstance(length, bool) or not isinstance(length, int) or length < -1:
            raise ValueError(f"length must be an int >= 0, or -1 for no length; got {length!r}")
        self.masks = checked.masks
        self.recursive = checked.recursive
        self.abspath = checked.abspath
        self.non_deterministic = checked.non_deterministic
        self.length = length

    def _expand(self, root: Any) -> list[str]:
        if not isinstance(root, (str, os.PathLike)):
            raise TypeError(
                f"list_files() expects root paths (str), got {type(root).__name__} {root!r}"
            )
        lister = FileLister(
            root,
            self.masks,
            recursive=self.recursive,
            abspath=self.abspath,
            non_deterministic=self.non_deterministic,
        )
        return lister._list()

    # -- what a checkpoint records (docs/storage.md) --------------------------------
    _kept_listing: tuple[tuple, FileLister] | None = None  # the last, while no root changed

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_kept_listing", None)  # the main process's alone: not sent to workers
        return state

    def _all_roots(self) -> FileLister | None:
        """Over a fixed list of roots: a FileLister of them all, listed now (the workers
        list each root again as it arrives, every epoch); None over any other stream, or
        when a root cannot be listed (it raises where it is read)."""
        roots = fixed_roots(self.source)
        if roots is None:
            return None
        key = self._settled_roots(roots)
        kept = self._kept_listing
        if key is not None and kept is not None and kept[0] == key:
            return kept[1]  # no root changed since: no need to list them again
        lister = FileLister(roots, self.masks, recursive=self.recursive, abspath=self.abspath)
        try:
            lister._paths = CompactStringList(lister._list())  # sorted: a stable record
        except OSError:
            return None
        self._kept_listing = None if key is None else (key, lister)
        return lister

    def _settled_roots(self, roots: list[str]) -> tuple | None:
        """The roots' identities and modification times, which change when a file is
        added, removed or renamed in them; None when that cannot tell (a recursive
        listing, a root that cannot be read, or one changed in the last SETTLED_NS)."""
        if self.recursive:
            return None
        now = time.time_ns()
        key = []
        for root in roots:
            try:
                stat = os.stat(root)
            except OSError:
                return None
            if now - stat.st_mtime_ns < SETTLED_NS:
                return None
            key.append((root, stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns))
        return tuple(key)

    def describe_data(self, *, contents: bool = False) -> dict[str, str] | None:
        """Over a fixed list of roots, what a checkpoint records of their files, as for
        ``FileLister(roots)``: the listing, and with ``contents`` each file's size and
        time, both taken now. None over any other stream."""
        lister = self._all_roots()
        return None if lister is None else lister.describe_data(contents=contents)

    def changed_data(self, saved: dict[str, Any]) -> list[str]:
        """What changed since ``saved`` (``describe_data``'s), the roots listed again now."""
        lister = self._all_roots()
        return [] if lister is None else lister.changed_data(saved)

    def unchecked_data(self) -> str | None:
        """Why a resume cannot check the files (``load_state_dict`` warns); None when the
        roots are a fixed list, which is checked."""
        return None if fixed_roots(self.source) is not None else _UNCHECKED

    def __len__(self) -> int:
        if self.length == -1:
            raise TypeError(
                "RootLister has no length: the number of files is known only by listing; "
                "pass length=N to list_files() to declare it"
            )
        return self.length

    def __repr__(self) -> str:
        return (
            f"RootLister(masks={list(self.masks)!r}, recursive={self.recursive}, "
            f"abspath={self.abspath}, non_deterministic={self.non_deterministic})"
        )


class FSSpecRootLister(Expander):
    """Yield the files under each incoming fsspec URL (functional: ``list_files_by_fsspec``).

    Each root is listed when it arrives with the rules of
    :class:`FSSpecFileLister`: files only (torchdata 0.9 also yielded
    directories), sorted per root, as full URLs. A checkpoint records no
    listing of them (``load_state_dict`` warns that it cannot check them): list
    a fixed set of roots with :class:`FSSpecFileLister` to have them checked.

    Args:
        source: a block yielding root URLs such as ``"s3://bucket/dir"``.
        masks: glob pattern(s) matched against file names.
        recursive: also list subdirectories (pipeloom's addition).
        **kwargs: storage options for the file system (credentials...).

    Example:
        >>> import fsspec
        >>> from pipeloom.datapipes import IterableWrapper
        >>> fsspec.filesystem("memory").pipe({"/roots/b/2.txt": b"", "/roots/a/1.txt": b""})
        >>> list(IterableWrapper(["memory://roots/b", "memory://roots/a"]).list_files_by_fsspec())
        ['memory:///roots/b/2.txt', 'memory:///roots/a/1.txt']
    """

    def __init__(
        self,
        source: IterDataPipe,
        masks: str | Sequence[str] = "",
        *,
        recursive: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(source)
        from ._fsspec import FSSpecFileLister

        checked = FSSpecFileLister("memory://", masks, recursive=recursive)
        self.masks, self.recursive = checked.masks, checked.recursive
        self.storage_options = kwargs

    def _expand(self, root: Any) -> list[str]:
        from ._fsspec import FSSpecFileLister

        if not isinstance(root, str):
            raise TypeError(
                f"list_files_by_fsspec() expects root URLs (str), got {type(root).__name__} "
                f"{root!r}"
            )
        lister = FSSpecFileLister(
            root, self.masks, recursive=self.recursive, **self.storage_options
        )
        return lister._list()

    def unchecked_data(self) -> str:
        """Why a resume cannot check the files (``load_state_dict`` warns)."""
        return _UNCHECKED

    def __repr__(self) -> str:
        return f"FSSpecRootLister(masks={list(self.masks)!r}, recursive={self.recursive})"
