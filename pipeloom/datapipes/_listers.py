"""Listing sources: ``FileLister`` (local files) and the base every lister shares.

A lister lists at first use, sorts the full paths and keeps the listing, in a
:class:`CompactStringList`, for every epoch; a loader's checkpoint records
what it listed (``describe_data``) so a resume over changed files is refused.
"""

from __future__ import annotations

import fnmatch
import os
import warnings
from collections.abc import Sequence
from typing import Any

from ._base import IterDataPipe
from ._compact import CompactStringList
from ._listing_check import Stats, changed_files, describe_listing, file_identities, local_stats
from ._state_fields import state_count

__all__ = ["FileLister", "Lister"]


def _as_masks(masks: str | Sequence[str]) -> tuple[str, ...]:
    if isinstance(masks, str):
        return (masks,) if masks else ()
    if isinstance(masks, Sequence) and all(isinstance(m, str) for m in masks):
        return tuple(m for m in masks if m)
    raise TypeError(f"masks must be a str or a list of str like ['*.tar'], got {masks!r}")


def _matches(name: str, masks: tuple[str, ...]) -> bool:
    return not masks or any(fnmatch.fnmatch(name, mask) for mask in masks)


class Lister(IterDataPipe):
    """Base of listing sources: lists once (lazily), keeps the listing compact.

    Subclasses implement ``_list() -> list[str]``. The listing is taken at
    first use and reused every epoch, stored in a :class:`CompactStringList`
    so forked workers reading it do not copy it.
    """

    def __init__(self, masks: str | Sequence[str]) -> None:
        self.masks = _as_masks(masks)
        self._paths: CompactStringList | None = None
        self._described: str | None = None  # the listing's description
        self._position = 0

    def _list(self) -> list[str]:
        raise NotImplementedError

    def _where(self) -> str:
        raise NotImplementedError

    def listing(self) -> CompactStringList:
        """The paths of one epoch (listed on first call)."""
        if self._paths is None:
            self._paths = CompactStringList(self._list())
            if not len(self._paths):
                warnings.warn(
                    f"{self!r}: no file under {self._where()} matches masks "
                    f"{list(self.masks) or '(none)'}; the epoch is empty. Check the "
                    f"root and the masks (e.g. masks='*.tar')",
                    UserWarning,
                    stacklevel=3,
                )
        return self._paths

    # Each listed file's size and a version (a time, an ETag) for a checkpoint; None:
    # not known (then only the listing is recorded).
    _file_stats: Stats | None = None

    def describe_data(self, *, contents: bool = False) -> dict[str, str]:
        """What a loader's checkpoint records of the files (see ``_listing_check``):
        the listing, and with ``contents`` each file's size and time (or version)."""
        if self._described is None:
            self._described = describe_listing(self.listing())
        described = {"listing": self._described}
        if contents and self._file_stats is not None:  # taken now: files change
            described["files"] = file_identities(self.listing(), self._file_stats)
        return described

    def changed_data(self, saved: dict[str, Any]) -> list[str]:
        """What changed since ``saved`` (``describe_data``'s), one line each."""
        listing = self.describe_data()["listing"]
        if saved.get("listing") != listing:
            return [
                f"listed {saved.get('listing')} when the state was saved, now {listing} "
                f"(files added, removed or renamed)"
            ]
        if "files" in saved:  # one stat per file, compared with the saved ones
            return changed_files(self.listing(), saved["files"], self._file_stats or local_stats)
        return []

    def reset(self) -> None:
        self._position = 0

    def async_next(self) -> str:
        paths = self.listing()
        position = self._position
        if position >= len(paths):
            raise StopIteration
        self._position = position + 1
        self._stamp_item(position)
        return paths[position]

    def __len__(self) -> int:
        return len(self.listing())

    def state_dict(self) -> dict[str, Any]:
        return {"position": self._position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._position = state_count(self, state, "position")


class FileLister(Lister):
    """Yield the paths of files under ``root`` whose name matches ``masks``, sorted.

    Args:
        root: a directory or file path, or a list of them.
        masks: glob pattern(s) matched against the file name, e.g. ``"*.tar"``;
            empty matches everything.
        recursive: also list subdirectories.
        abspath: yield absolute paths.
        non_deterministic: keep the file system's order instead of sorting.

    Raises:
        FileNotFoundError: at first use, naming a root that does not exist.

    Example:
        >>> import os, tempfile
        >>> root = tempfile.mkdtemp()
        >>> os.makedirs(os.path.join(root, "sub"))
        >>> for name in ("x.tar", "sub/y.tar", "sub/z.txt"):
        ...     open(os.path.join(root, name), "w").close()
        >>> [os.path.relpath(p, root) for p in FileLister(root, "*.tar", recursive=True)]
        ['sub/y.tar', 'x.tar']
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] = ".",
        masks: str | Sequence[str] = "",
        *,
        recursive: bool = False,
        abspath: bool = False,
        non_deterministic: bool = False,
    ) -> None:
        roots = [root] if isinstance(root, (str, os.PathLike)) else root
        if (
            not isinstance(roots, Sequence)
            or not roots
            or not all(isinstance(r, (str, os.PathLike)) for r in roots)
        ):
            raise TypeError(
                f"root must be a path or a non-empty list of paths, got {root!r}; "
                f"for a stream of roots (e.g. an IterDataPipe) use roots.list_files(masks)"
            )
        super().__init__(masks)
        self.roots = tuple(os.fspath(r) for r in roots)
        self.recursive = bool(recursive)
        self.abspath = bool(abspath)
        self.non_deterministic = bool(non_deterministic)

    def _where(self) -> str:
        return ", ".join(repr(r) for r in self.roots)

    _file_stats = staticmethod(local_stats)

    def _list(self) -> list[str]:
        found: list[str] = []
        for root in self.roots:
            if not os.path.exists(root):
                raise FileNotFoundError(
                    f"FileLister: root {root!r} does not exist (cwd {os.getcwd()!r}); "
                    f"pass an existing directory or file"
                )
            if os.path.isfile(root):
                if _matches(os.path.basename(root), self.masks):
                    found.append(os.path.abspath(root) if self.abspath else root)
                continue
            base = os.path.abspath(root) if self.abspath else root
            for directory, dirs, files in os.walk(base, onerror=_raise_walk_error):
                if not self.non_deterministic:
                    dirs.sort()
                found.extend(os.path.join(directory, n) for n in files if _matches(n, self.masks))
                if not self.recursive:
                    dirs.clear()
        return found if self.non_deterministic else sorted(found)

    def __repr__(self) -> str:
        root = self.roots[0] if len(self.roots) == 1 else list(self.roots)
        return (
            f"FileLister(root={root!r}, masks={list(self.masks)!r}, "
            f"recursive={self.recursive}, abspath={self.abspath}, "
            f"non_deterministic={self.non_deterministic})"
        )


def _raise_walk_error(error: OSError) -> None:
    raise error
