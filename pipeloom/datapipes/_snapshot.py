"""``snapshot``: keep an edge's items on disk, keyed by a fingerprint of everything upstream.

The first epoch runs the upstream and writes its items as they pass; the
following epochs (and later runs of the same pipeline) read them back instead
of running the upstream. Details and guarantees: ``docs/caching.md``.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from ._base import IterDataPipe
from ._context import worker_info
from ._fingerprint import fingerprint, random_blocks
from ._pipeline import upstream_blocks
from ._positions import authority_index, sharded_upstream
from ._records import RecordReader
from ._snapshot_modes import OrderedReader, Passthrough, PositionReader, Writer
from ._snapshot_store import (
    CHECKED_FORMAT,
    KEYED_FORMAT,
    OWNED_FORMAT,
    SEALED_FORMAT,
    SnapshotStore,
    manifest_owners,
    run_name,
)

__all__ = ["Snapshot"]


class Snapshot(IterDataPipe):
    """Write the items passing here to disk once, read them after (functional: ``snapshot``).

    The snapshot lives in ``path/<fingerprint>``, where the fingerprint digests
    every block upstream, its arguments, the code of its functions and the
    identity (size, modification time) of the local files the sources name
    (see :mod:`pipeloom.datapipes._fingerprint`). Change anything upstream and
    the next epoch writes a new snapshot beside the old one (a warning at
    construction names what changed).

    Where the items are made, they are written: in the calling process, or in
    each worker for its shard (a manifest per worker; the snapshot counts only
    once every worker finished and together they saw every position). It is
    committed by an atomic rename, so a crash never leaves a snapshot that is
    read. Reading it back: in order in the main process; in a worker, the
    sharding point (cheap: a file or index list) says which positions are the
    worker's, and their records are read from the snapshot whatever the
    number of workers that wrote it. Items come back with the stamps they
    would have had, so ``item_rng()`` downstream draws as without the snapshot.

    Args:
        source: the edge to snapshot.
        path: a directory for this edge's snapshots.
        key: key the snapshot by this string instead of the fingerprint (you
            change it when the upstream changes).
        allow_random: accept random blocks upstream (shuffle, ...): the
            snapshot then freezes the randomness of the epoch that wrote it.
        shard_size: MiB of records per file (a larger record gets its own).

    Raises:
        ValueError: a random block upstream without ``allow_random=True``.
        UnfingerprintableError: an upstream value with no stable identity.

    Example:
        >>> import tempfile
        >>> from pipeloom.datapipes import IterableWrapper
        >>> folder = tempfile.mkdtemp()
        >>> calls = []
        >>> pipe = IterableWrapper(range(4)).map(lambda x: calls.append(x) or x * x)
        >>> snap = pipe.snapshot(folder)
        >>> list(snap), list(snap), calls
        ([0, 1, 4, 9], [0, 1, 4, 9], [0, 1, 2, 3])
    """

    inputs = ("source",)
    per_item = True
    one_to_one = True
    per_rank_fields = ("path", "shard_size")

    def __init__(
        self,
        source: IterDataPipe,
        path: str | os.PathLike[str],
        *,
        key: str | None = None,
        allow_random: bool = False,
        shard_size: int = 256,
    ) -> None:
        if not isinstance(source, IterDataPipe):
            raise TypeError(f"snapshot expects an IterDataPipe, got {type(source).__name__}")
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a directory path, got {type(path).__name__} {path!r}")
        if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
            raise ValueError(f"shard_size must be an int >= 1 (MiB per file), got {shard_size!r}")
        randoms = random_blocks(source)
        if randoms and not allow_random:
            raise ValueError(
                f"snapshot would freeze the randomness of {randoms[0]!r} upstream (an order, or "
                f"the seeds item_rng() draws from): every later epoch would replay the first "
                f"epoch's. Move that block after .snapshot(...), or pass allow_random=True to "
                f"freeze it on purpose"
            )
        self.source = source
        self._random_upstream = bool(randoms)
        self.path = os.fspath(path)
        self.key = key
        self.allow_random = bool(allow_random)
        self.shard_size = shard_size
        self.fingerprint = fingerprint(source, key=key)
        self._run = run_name()
        self._passes = 0
        self._mode: Any = None
        self._reader: RecordReader | None = None
        self._unreplayable = False  # a pass found items a replay could not stamp right
        self._warned: set[str] = set()  # the kinds of warning given (once each)
        self._warn_if_rebuilt()
        self.reset()

    @property
    def directory(self) -> str:
        """Where this upstream's snapshot is (or will be) kept."""
        return os.path.join(self.path, self.fingerprint.digest)

    def is_complete(self) -> bool:
        """True when a complete snapshot of this upstream is on disk."""
        return SnapshotStore(self.path, self.fingerprint.digest).is_complete()

    def _warn_if_rebuilt(self) -> None:
        others = SnapshotStore(self.path, self.fingerprint.digest).others()
        if not others or self.is_complete():
            return
        digest, manifest = others[0]
        changed = self.fingerprint.changed_blocks(manifest.get("blocks", []))
        warnings.warn(
            f"the snapshot in {os.path.join(self.path, digest)} was made from a different "
            f"upstream ({'; '.join(changed[:3]) or 'the key changed'}); the first epoch writes "
            f"a new one in {self.directory}. Delete the old one if you no longer need it",
            UserWarning,
            stacklevel=3,
        )

    def _warn_once(self, kind: str, message: str) -> None:
        """Warn with ``message`` the first time this block meets ``kind``."""
        if kind in self._warned:
            return
        self._warned.add(kind)
        warnings.warn(message, UserWarning, stacklevel=4)

    def _warn_live(self, directory: str) -> None:
        self._warn_once(
            "live",
            f"{self!r} reads its upstream live here: the records in {directory} are not "
            f"the sharding point's positions one by one, in order (a shuffle, batch, groupby "
            f"or second source between them), so a worker cannot take its share of them, "
            f"and a replay of all could give it the others' items. Put such blocks after "
            f"the .snapshot(...)",
        )

    def _warn_unowned(self, directory: str) -> None:
        self._warn_once(
            "unowned",
            f"the snapshot in {directory} was written by an older pipeloom that did not note "
            f"which block stamped each item; over several sources (concat, mux) it replays "
            f"their items with one seed, so item_rng() after it gives items of different "
            f"sources the same draws. Delete it to rebuild it",
        )

    # -- one pass ----------------------------------------------------------------
    def reset(self) -> None:
        if self._mode is not None:
            self._mode.abandon()
        self._mode = None
        self._passes += 1
        self._emitted = 0  # outputs returned this pass
        self._pulled = 0  # outputs taken from the source this pass
        self._resumed = False
        self._resume_group: tuple[int, int] | None = None  # (position, its records given)

    def async_next(self) -> Any:
        mode = self._mode
        if mode is None:
            mode = self._mode = self._choose()
        return mode.next()

    def _choose(self) -> Any:
        store = SnapshotStore(self.path, self.fingerprint.digest)
        info = worker_info()
        # a task's part of the epoch (economic, chunked), also where the main process runs
        # a task: read by position, never written (``feeds_one_task`` of the task feeds)
        tasks = any(getattr(b, "feeds_one_task", False) for b in self._upstream())
        if store.is_complete():
            manifest = store.manifest()
            reader = self._reader
            if reader is None or reader.directory != store.final:
                reader = RecordReader(
                    store.final,
                    keyed=manifest["format"] >= KEYED_FORMAT,
                    records=manifest["records"],
                    checked=manifest["format"] >= CHECKED_FORMAT,
                    sealed=manifest["checksums"] if manifest["format"] >= SEALED_FORMAT else None,
                )
                self._reader = reader
            authority = authority_index(self)
            by_position = info is not None or tasks or sharded_upstream(self)
            if by_position:  # a worker's or rank's share: by the sharding point's positions
                split = _by_position(manifest) and reader.is_sorted()
                whole = info is None and not tasks  # (a rank's share in its main process)
                if authority is not None and split:
                    # a record holding items of several positions (a batch after a flatmap)
                    # may straddle the runs of positions the workers' shares are made of
                    if whole or not manifest.get("straddles", False):
                        return PositionReader(self, reader, authority, manifest.get("positions"))
                self._warn_live(store.final)
                return Passthrough(self)
            owners = manifest_owners(manifest)
            if manifest["format"] < OWNED_FORMAT and not manifest["stamper"]:
                self._warn_unowned(store.final)
            return OrderedReader(self, reader, authority if manifest["stamper"] else None, owners)
        if self._resume_group is not None:
            raise RuntimeError(
                f"{self!r}: the checkpoint was taken while reading the snapshot in "
                f"{store.final}, which is gone; restore it, or resume from the epoch's start"
            )
        if self._resumed or self._unreplayable or tasks:  # a task sees part of the epoch
            return Passthrough(self)
        if sharded_upstream(self):
            name = "w0000" if info is None else f"w{info.id:04d}"
            expected = 1 if info is None else info.num_workers
            if not self._writers_see_all(expected):  # a rank's share: a whole epoch writes it
                return Passthrough(self)
            return Writer(self, store, name, expected, watch=True)
        if info is None:
            return Writer(self, store, "w0000", 1, watch=False)
        return Passthrough(self)  # a replicated copy before the sharding point

    def _writers_see_all(self, writers: int) -> bool:
        """Whether ``writers`` writers (this process, or each of its workers) together see
        every position: not when the sharding point keeps a share of a share (one rank's).
        A rank whose share is the first positions would otherwise commit them as all."""
        shards = [b._noted_shard()[0] for b in self._upstream() if b.is_shardable()]
        return all(total <= writers for total in shards)

    def _upstream(self) -> list[Any]:
        return upstream_blocks(self)[1:]

    def _pull(self) -> Any:
        item = self.source.async_next()
        self._pulled += 1
        return item

    def _authority(self, index: int) -> IterDataPipe:
        block = upstream_blocks(self)[index]
        assert isinstance(block, IterDataPipe)
        return block

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        group = self._mode.group() if isinstance(self._mode, PositionReader) else None
        return {"emitted": self._emitted, "pulled": self._pulled, "group": group}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._mode is not None:
            self._mode.abandon()
            self._mode = None
        self._emitted, self._pulled = int(state["emitted"]), int(state["pulled"])
        group = state.get("group")
        self._resume_group = None if group is None else (int(group[0]), int(group[1]))
        self._resumed = True

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_mode"] = None
        state["_reader"] = None
        return state

    def __repr__(self) -> str:
        return f"Snapshot(path={self.path!r}, fingerprint={self.fingerprint.digest[:12]!r})"


def _by_position(manifest: dict[str, Any]) -> bool:
    """Whether a snapshot's records are its sharding point's positions, in their order."""
    return bool(manifest["stamper"]) and manifest.get("ordered", True) is True
