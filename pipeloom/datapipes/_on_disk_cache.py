"""``on_disk_cache`` / ``end_caching``: make a file once (download, extract), reuse it after.

``on_disk_cache`` sits where the keys come in (URLs, archive names) and
``end_caching`` where their contents come out: for a key whose file is on
disk the blocks in between are skipped and ``end_caching`` yields the file's
path; otherwise they run and ``end_caching`` writes what they give into the
file (atomically, under a lock other processes wait on) and yields its path.
Either way the paths come out in the order of the keys, so the output is the
same on the first run and every later one. Details: ``docs/caching.md``.
"""

from __future__ import annotations

import os
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

from ..errors import NotAvailable
from ._base import DataPipe, IterDataPipe
from ._cache_files import FileLock, file_hash, write_atomically
from ._context import current_stamp, key_position, restore_stamp
from ._pipeline import is_sharding_root, upstream_blocks

__all__ = ["EndOnDiskCacheHolder", "OnDiskCacheHolder"]

LIST_SUFFIX = ".cached_files"  # next to a key whose contents are several files
MAKING_SUFFIX = ".cache_making"  # next to a key being made: its files are not all there yet
_HASH_TYPES = ("sha256", "md5")


class OnDiskCacheHolder(IterDataPipe):
    """Start an on-disk cache: keys whose file exists skip ahead (functional: ``on_disk_cache``).

    Args:
        source: the keys (e.g. URLs).
        filepath_fn: maps a key to the path of its file (default: the key is the path).
        hash_dict: ``{path: hex digest}``; a cached file whose hash differs is made
            again, and new data whose hash differs raises instead of being written.
        hash_type: ``"sha256"`` or ``"md5"``.
        extra_check_fn: ``fn(path) -> bool``; False makes the file again.

    Must be followed (after the blocks that make the file) by ``.end_caching()``.
    It is a sharding point: without a ``sharding_filter`` upstream, workers
    split the keys here (each worker checks, fetches and yields its share).

    Example:
        >>> import os, tempfile
        >>> from pipeloom.datapipes import IterableWrapper
        >>> folder = tempfile.mkdtemp()
        >>> made = []
        >>> def make(name):
        ...     made.append(name)
        ...     return name, name.upper()
        >>> pipe = (
        ...     IterableWrapper(["a", "b"])
        ...     .on_disk_cache(filepath_fn=lambda name: os.path.join(folder, name))
        ...     .map(make)
        ...     .end_caching(mode="w", same_filepath_fn=True)
        ... )
        >>> [os.path.basename(p) for p in pipe], [os.path.basename(p) for p in pipe], made
        (['a', 'b'], ['a', 'b'], ['a', 'b'])
    """

    inputs = ("source",)
    read_by_several = True  # its end block consults it too (refuse_shared_streams)
    per_item = True
    at_most_one = True
    per_rank_fields = ("timeout",)

    def __init__(
        self,
        source: IterDataPipe,
        filepath_fn: Callable[[Any], str] | None = None,
        hash_dict: dict[str, str] | None = None,
        hash_type: str = "sha256",
        extra_check_fn: Callable[[str], bool] | None = None,
    ) -> None:
        if not isinstance(source, IterDataPipe):
            raise TypeError(f"on_disk_cache expects an IterDataPipe, got {type(source).__name__}")
        for name, fn in (("filepath_fn", filepath_fn), ("extra_check_fn", extra_check_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable or None, got {type(fn).__name__} {fn!r}")
        if hash_dict is not None and not (
            isinstance(hash_dict, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in hash_dict.items())
        ):
            raise TypeError(
                f"hash_dict must be a dict of path -> hex digest (str), got {hash_dict!r}"
            )
        if hash_type not in _HASH_TYPES:
            raise ValueError(f"hash_type must be 'sha256' or 'md5', got {hash_type!r}")
        self.source = source
        self.filepath_fn = filepath_fn
        self.hash_dict = hash_dict
        self.hash_type = hash_type
        self.extra_check_fn = extra_check_fn
        self.ended = False  # set by end_caching
        self.timeout: float | None = 300.0
        self._lock: FileLock | None = None
        self._making: dict[int | None, _Origin] = {}  # keys given to the blocks in between
        self._total, self._index, self._group = 1, 0, 1
        self.reset()

    # -- sharding: where no sharding point is upstream, the keys are split here ----------
    def is_shardable(self) -> bool:
        return True

    def sharding_settings(self, total: int, index: int) -> None:
        """Keep the keys at positions ``(p // group_size) % total == index``."""
        if isinstance(total, bool) or not isinstance(total, int) or total < 1:
            raise ValueError(f"total must be an int >= 1, got {total!r}")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < total:
            raise ValueError(f"index must be an int in [0, {total}), got {index!r}")
        self._total, self._index = total, index

    def set_shard_group_size(self, group_size: int) -> None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
        self._group = group_size

    def resume_at(self, position: int) -> None:
        self._resume_from = position

    def reset(self) -> None:
        self._unlock()
        self._pending: deque[tuple[tuple, list[str]]] = deque()  # cached keys: (stamp, paths)
        self._making = {}
        self._position = 0  # keys read from the source this pass
        self._resume_from = 0
        self._root: bool | None = None

    def _next_key(self) -> Any:
        while True:
            key = self.source.async_next()
            position = self._position
            self._position = position + 1
            if position < self._resume_from:
                continue
            if self._total == 1 or (position // self._group) % self._total == self._index:
                break
        if self._root is None:
            self._root = is_sharding_root(self)
        if self._root:  # below another sharding point: keep its positions
            self._stamp_item(position)
        return key

    def async_next(self) -> Any:
        if not self.ended:
            raise RuntimeError(
                f"{self!r} is iterated without .end_caching(): add .end_caching(...) after the "
                f"blocks that make the files"
            )
        # The blocks in between asked for the next key: the last one's files are all written.
        # List them before letting go of its lock, or a process waiting on it would find the
        # key's own path alone and take it for a single-file key.
        self._list_files()
        self._unlock()
        while True:
            key = self._next_key()
            stamp = current_stamp()
            path = self.path_of(key)
            cached = self._cached(path)
            lock = None
            if cached is None:
                lock = FileLock(path)
                lock.acquire(self.timeout)  # another process may be making it: wait
                cached = self._cached(path)
            if cached is None:
                self._lock = lock
                _mark_making(path)  # until the key's files are all there (or listed)
                self._making[key_position(stamp[2])] = _Origin(path)
                return key
            if lock is not None:
                lock.release()
            self._pending.append((stamp, cached))

    def _unlock(self) -> None:
        """Let go of the key's lock; a key that wrote nothing drops its marker too."""
        for origin in self._making.values():
            if not origin.outputs:
                _unmark(origin)
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def path_of(self, key: Any) -> str:
        path = key if self.filepath_fn is None else self.filepath_fn(key)
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if not isinstance(path, str):
            raise TypeError(
                f"on_disk_cache needs a path (str) for each item, got {type(path).__name__} "
                f"{path!r}; pass filepath_fn=... mapping the item to its file"
            )
        return path

    def _cached(self, path: str) -> list[str] | None:
        """The cached files for ``path``, or None when they must be made."""
        if os.path.exists(path + MAKING_SUFFIX):  # its maker stopped midway (or still runs)
            return None
        listed = path + LIST_SUFFIX
        if os.path.exists(listed):
            with open(listed) as file:
                paths = [line for line in file.read().split("\n") if line]
            # an empty list is damaged (one is written for two files or more): make it again
            return paths if paths and all(os.path.exists(p) for p in paths) else None
        if not os.path.isfile(path):
            return None
        if self.hash_dict is not None:
            expected = self.expected_hash(path)
            got = file_hash(path, self.hash_type)
            if got != expected:
                warnings.warn(
                    f"the cached file {path} has {self.hash_type} {got}, expected {expected}; "
                    f"making it again",
                    UserWarning,
                    stacklevel=2,
                )
                return None
        if self.extra_check_fn is not None and not self.extra_check_fn(path):
            return None
        return [path]

    def expected_hash(self, path: str) -> str | None:
        if self.hash_dict is None:
            return None
        if path not in self.hash_dict:
            raise ValueError(
                f"hash_dict has no entry for {path}; add its {self.hash_type} or drop hash_dict"
            )
        return self.hash_dict[path]

    def made(self, position: int | None, path: str) -> None:
        """``end_caching`` wrote ``path`` for the key at ``position``."""
        origin = self._making.get(position)
        if origin is not None:
            origin.outputs.append(path)
            origin.many = origin.many or path != origin.path
            origin.listed = False  # a block reading ahead (threadpool_map) can add files later

    def done_before(self, position: int | None) -> list[tuple[tuple, list[str]]]:
        """Close the keys before ``position`` (all: None); return the cached ones among them.

        A key that made several files gets its list of files, so a later run
        yields them without making them.
        """
        for key in [k for k in self._making if position is None or k is None or k < position]:
            self._finish(self._making.pop(key))
        out = []
        pending = self._pending
        while pending and (
            position is None or pending[0][0][2] is None or pending[0][0][2] < position
        ):
            out.append(pending.popleft())
        return out

    def _list_files(self) -> None:
        """Finish every key being made: its files are all written."""
        for origin in self._making.values():
            self._finish(origin)

    @staticmethod
    def _finish(origin: _Origin) -> None:
        """List the key's files if it made several, then say it is made (drop its marker)."""
        if origin.many and not origin.listed:
            write_atomically(
                origin.path + LIST_SUFFIX,
                "\n".join(origin.outputs),
                "w",
                expected_hash=None,
                hash_type="sha256",
            )
            origin.listed = True
        _unmark(origin)

    def state_dict(self) -> dict[str, Any]:
        return {
            "position": self._position,
            "pending": [(tuple(s), list(p)) for s, p in self._pending],
            "making": [(k, o.path, list(o.outputs), o.many) for k, o in self._making.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume; the key being made is finished without its lock (gone with the old process)."""
        self._unlock()
        self._position = int(state["position"])
        self._pending = deque((tuple(s), list(p)) for s, p in state["pending"])
        self._making = {
            k: _Origin(path, list(out), bool(many)) for k, path, out, many in state["making"]
        }

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_lock"] = None
        return state

    def __repr__(self) -> str:
        fn = getattr(self.filepath_fn, "__name__", self.filepath_fn)
        return f"OnDiskCacheHolder(filepath_fn={fn}, hash_type={self.hash_type!r})"


class _Origin:
    """A key being made into files: its path and the files written for it so far."""

    __slots__ = ("path", "outputs", "many", "listed", "marked")

    def __init__(self, path: str, outputs: list[str] | None = None, many: bool = False) -> None:
        self.path = path
        self.outputs = [] if outputs is None else outputs
        self.many = many
        self.listed = False  # its list of files is written (a resumed key writes it again)
        self.marked = True  # its marker may be on disk (a resumed key drops the old one)


def _unmark(origin: _Origin) -> None:
    if origin.marked:
        try:
            os.unlink(origin.path + MAKING_SUFFIX)
        except FileNotFoundError:  # another process made the same key meanwhile
            pass
        origin.marked = False


def _mark_making(path: str) -> None:
    """Leave ``<path>.cache_making`` until the key is made.

    A maker stopped midway (killed, or its epoch broken off) leaves it, so a
    later run makes the key again instead of taking the files written so far
    for all of them (a key whose first file has the key's own path).
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + MAKING_SUFFIX, "w"):
        pass


class EndOnDiskCacheHolder(IterDataPipe):
    """End an on-disk cache: write ``(key, data)`` to files (functional: ``end_caching``).

    Args:
        source: ``(metadata, stream or data)`` items from the blocks that make files.
        mode: ``"wb"`` (bytes) or ``"w"`` (text).
        filepath_fn: maps the metadata to the file to write (default: the metadata).
        same_filepath_fn: use ``on_disk_cache``'s ``filepath_fn`` (exclusive with ``filepath_fn``).
        skip_read: the data is already ``bytes``/``str`` (streams are read either way).
        timeout: seconds to wait for another process making the same file.

    Paths come out in the order of the keys (by their stamped position), cached
    or not. When one key makes several files (an archive extracted), their
    paths are kept in ``<key path>.cached_files``, written once the key is
    done, and a later run yields them all.

    Raises:
        ValueError: no ``on_disk_cache`` upstream (or it already has its
            ``end_caching``), bad arguments, or a block in between that does
            not work key by key.
    """

    inputs = ("source", "holder")
    per_item = True
    per_rank_fields = ("timeout",)

    def __init__(
        self,
        source: IterDataPipe,
        mode: str = "wb",
        filepath_fn: Callable[[Any], str] | None = None,
        *,
        same_filepath_fn: bool = False,
        skip_read: bool = False,
        timeout: float | None = 300,
    ) -> None:
        if not isinstance(mode, str) or mode not in ("w", "wb", "wt"):
            raise ValueError(f"mode must be 'wb' (bytes) or 'w' (text), got {mode!r}")
        if filepath_fn is not None and same_filepath_fn:
            raise ValueError(
                "filepath_fn and same_filepath_fn=True both say where files go; pass only one"
            )
        if filepath_fn is not None and not callable(filepath_fn):
            raise TypeError(f"filepath_fn must be callable or None, got {filepath_fn!r}")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
        ):
            raise ValueError(f"timeout must be a number of seconds > 0 or None, got {timeout!r}")
        holder = _open_holder(source)
        self.source = source
        self.holder = holder
        self.mode = mode
        self.filepath_fn = holder.filepath_fn if same_filepath_fn else filepath_fn
        self.same_filepath_fn = bool(same_filepath_fn)
        self.skip_read = bool(skip_read)
        self.timeout = timeout
        holder.ended, holder.timeout = True, timeout
        self.reset()

    def reset(self) -> None:
        self._ready: deque[tuple[tuple, str]] = deque()

    def async_next(self) -> Any:
        if not self._ready:
            self._fill()
        stamp, path = self._ready.popleft()
        restore_stamp(stamp)
        return path

    def _fill(self) -> None:
        holder = self.holder
        try:
            item = self.source.async_next()
        except StopIteration:
            self._queue(holder.done_before(None))
            if not self._ready:
                raise
            return
        except NotAvailable:
            raise
        except BaseException:  # a block in between failed on its key: let others make it
            holder._unlock()
            raise
        stamp = current_stamp()
        # cached keys before this one come first
        self._queue(holder.done_before(key_position(stamp[2])))
        try:
            path = self._save(item)
        except BaseException:
            holder._unlock()  # the key failed: let others try it
            raise
        holder.made(key_position(stamp[2]), path)
        self._ready.append((stamp, path))

    def _queue(self, cached: list[tuple[tuple, list[str]]]) -> None:
        for stamp, paths in cached:
            self._ready.extend((stamp, p) for p in paths)

    def _save(self, item: Any) -> str:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(
                f"end_caching expects (metadata, data) pairs such as (url, stream), got "
                f"{type(item).__name__}; the blocks before it must yield such pairs"
            )
        meta, data = item
        path = meta if self.filepath_fn is None else self.filepath_fn(meta)
        path = os.fspath(path) if isinstance(path, os.PathLike) else path
        if not isinstance(path, str):
            raise TypeError(f"end_caching needs a file path for {meta!r}, got {path!r}")
        if self.skip_read and hasattr(data, "read"):
            raise TypeError(
                f"end_caching(skip_read=True) got a stream for {path}; drop skip_read to read it"
            )
        write_atomically(
            path,
            data,
            self.mode,
            expected_hash=self.holder.expected_hash(path),
            hash_type=self.holder.hash_type,
        )
        return path

    def state_dict(self) -> dict[str, Any]:
        return {"ready": [(tuple(s), p) for s, p in self._ready]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._ready = deque((tuple(s), str(p)) for s, p in state["ready"])

    def __repr__(self) -> str:
        fn = getattr(self.filepath_fn, "__name__", self.filepath_fn)
        return f"EndOnDiskCacheHolder(mode={self.mode!r}, filepath_fn={fn})"


def _open_holder(source: DataPipe) -> OnDiskCacheHolder:
    """The nearest ``on_disk_cache`` upstream of ``source``, checking the blocks in between."""
    holder = next((b for b in upstream_blocks(source) if isinstance(b, OnDiskCacheHolder)), None)
    if holder is None:
        raise ValueError(
            f"end_caching needs an .on_disk_cache(...) upstream, but none is upstream of "
            f"{source!r}; start the cached part with .on_disk_cache(filepath_fn=...)"
        )
    if holder.ended:
        raise ValueError(
            f"{holder!r} already has its end_caching(); call it once per on_disk_cache"
        )
    inside = {id(b) for b in upstream_blocks(holder)}
    for block in upstream_blocks(source):
        if id(block) in inside:
            continue
        works_per_key = block.per_item or block.is_shardable()
        if not works_per_key or len(block.parents) != 1:
            raise ValueError(
                f"between on_disk_cache and end_caching every block must work key by key (map, "
                f"filter, open/read, load_from_tar, ...), but {block!r} does not; move it before "
                f".on_disk_cache(...) or after .end_caching(...)"
            )
    return holder
