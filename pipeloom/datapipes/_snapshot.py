"""``snapshot``: keep an edge's items on disk, keyed by a fingerprint of everything upstream.

The first epoch runs the upstream and writes its items as they pass; the
following epochs (and later runs of the same pipeline) read them back instead
of running the upstream. Details and guarantees: ``docs/caching.md``.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

from ..errors import NotAvailable
from ._base import IterDataPipe
from ._context import current_stamp, restore_stamp, unwatch_stamps, watch_stamps, worker_info
from ._fingerprint import fingerprint, random_blocks
from ._pipeline import upstream_blocks
from ._positions import authority_index, sharded_upstream
from ._records import RecordReader, RecordWriter
from ._snapshot_store import SnapshotStore, run_name

__all__ = ["Snapshot"]

_LOG = logging.getLogger("pipeloom.snapshot")
_READ_AHEAD = 4 << 20  # bytes of records read at once when replaying in order


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
                f"snapshot would freeze the randomness of {randoms[0]!r} upstream: every later "
                f"epoch would replay the first epoch's order. Move the random block after "
                f".snapshot(...), or pass allow_random=True to freeze it on purpose"
            )
        self.source = source
        self.path = os.fspath(path)
        self.key = key
        self.allow_random = bool(allow_random)
        self.shard_size = shard_size
        self.fingerprint = fingerprint(source, key=key)
        self._run = run_name()
        self._passes = 0
        self._mode: Any = None
        self._reader: RecordReader | None = None
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
        if store.is_complete():
            reader = self._reader
            if reader is None or reader.directory != store.final:
                reader = self._reader = RecordReader(store.final)
            manifest = store.manifest()
            authority = authority_index(self)
            by_position = info is not None or sharded_upstream(self)
            if by_position and authority is not None and reader.is_sorted():
                return _PositionReader(self, reader, authority, manifest.get("positions"))
            return _OrderedReader(self, reader, authority if manifest["stamper"] else None)
        if self._resume_group is not None:
            raise RuntimeError(
                f"{self!r}: the checkpoint was taken while reading the snapshot in "
                f"{store.final}, which is gone; restore it, or resume from the epoch's start"
            )
        if self._resumed:
            return _Passthrough(self)
        if sharded_upstream(self):
            name = "w0000" if info is None else f"w{info.id:04d}"
            expected = 1 if info is None else info.num_workers
            return _Writer(self, store, name, expected, watch=True)
        if info is None:
            return _Writer(self, store, "w0000", 1, watch=False)
        return _Passthrough(self)  # a replicated copy before the sharding point

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
        group = self._mode.group() if isinstance(self._mode, _PositionReader) else None
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


class _Passthrough:
    """Neither reads nor writes: the source's items, after skipping what a resume already gave."""

    def __init__(self, block: Snapshot) -> None:
        self.block = block

    def next(self) -> Any:
        block = self.block
        while block._pulled < block._emitted:  # resumed after items we did not take
            block._pull()
        item = block._pull()
        block._emitted += 1
        return item

    def abandon(self) -> None:
        pass


class _Writer:
    """Passes the items on and records them; commits when the pass ends."""

    def __init__(
        self, block: Snapshot, store: SnapshotStore, name: str, expected: int, *, watch: bool
    ):
        self.block, self.store, self.name, self.expected = block, store, name, expected
        store.sweep()
        tag = f"e{block._pl_epoch}p{block._passes}"
        self.directory = store.pass_directory(block._run, tag)
        self.writer = RecordWriter(self.directory, name, block.shard_size << 20)
        index = authority_index(block)
        self.authority = None if index is None else block._authority(index)
        self.observed: list[int] | None = [] if watch else None
        self.root_seed = None
        if watch and self.authority is not None:
            self.root_seed = self.authority.epoch_seed()
        self.stamper: bool | None = None
        self.monotonic = True
        self.last = -1

    def _observe(self, seed: int | None, position: int) -> None:
        if seed == self.root_seed and self.observed is not None:
            self.observed.append(position)

    def next(self) -> Any:
        block = self.block
        previous = watch_stamps(self._observe) if self.observed is not None else None
        try:
            item = block._pull()
        except StopIteration:
            self._finish()
            raise
        finally:
            if previous is not None:
                unwatch_stamps(previous)
        seed, epoch, position, draws = current_stamp()
        if draws and not block.allow_random:
            raise RuntimeError(
                f"{block!r}: the item at position {position} drew from item_rng() upstream, so "
                f"the snapshot would freeze its random augmentation; apply it after the "
                f".snapshot(...), or pass allow_random=True to freeze it on purpose"
            )
        if self.stamper is None:
            self.stamper = self._stamped_by_authority(seed, epoch)
        if position is not None:
            self.monotonic = self.monotonic and position >= self.last
            self.last = position
        self.writer.append(position, draws, item)
        block._emitted += 1
        return item

    def _stamped_by_authority(self, seed: int | None, epoch: int) -> bool:
        authority = self.authority
        return (
            authority is not None
            and authority._pl_round == 0
            and getattr(authority, "_pl_epoch_seed", None) == seed
            and epoch == self.block._pl_epoch
        )

    def _finish(self) -> None:
        import numpy as np

        self.writer.close()
        if self.observed is not None:
            path = os.path.join(self.directory, f"observed-{self.name}.npy")
            np.save(path, np.asarray(self.observed, dtype=np.int64))
        summary = {
            "blocks": [list(b) for b in self.block.fingerprint.blocks],
            "records": self.writer.count,
            "bytes": self.writer.bytes_written,
            "observed": None if self.observed is None else True,
            "stamper": bool(self.stamper) or self.writer.count == 0,
            "monotonic": self.monotonic,
        }
        self.store.finish_writer(self.directory, self.name, summary, expected=self.expected)
        self.block._mode = _Passthrough(self.block)  # the source is spent: StopIteration again

    def abandon(self) -> None:
        self.writer.abort()


class _OrderedReader:
    """Replays every record in order (the main process, or a replicated copy)."""

    def __init__(self, block: Snapshot, reader: RecordReader, authority: int | None) -> None:
        self.block, self.reader = block, reader
        self.stamp: tuple[int | None, int] | None = None
        if authority is not None:
            self.stamp = (block._authority(authority).epoch_seed(), block._pl_epoch)
        self.buffer: list[tuple[int | None, int, Any]] = []
        self.next_record = block._emitted

    def next(self) -> Any:
        block = self.block
        if self.stamp is None:  # learn the epoch's stamp from one live item
            live = self._live()
            if live is not None:
                return live[0]
        if not self.buffer:
            self._read_ahead()
        position, draws, item = self.buffer.pop()
        restore_stamp((self.stamp[0], self.stamp[1], position, draws))  # type: ignore[index]
        block._emitted += 1
        return item

    def _live(self) -> tuple[Any] | None:
        block = self.block
        number = block._pulled
        if self.next_record >= len(self.reader):
            raise StopIteration
        item = block._pull()
        seed, epoch, position, _ = current_stamp()
        recorded = self.reader.index["position"][number]
        if position is not None and recorded != -1 and position != recorded:
            raise RuntimeError(
                f"{block!r}: the upstream gave position {position} where the snapshot in "
                f"{self.reader.directory} has {recorded}; the upstream changed in a way the "
                f"fingerprint did not see. Delete that directory (or change key=) to rebuild it"
            )
        self.stamp = (seed, epoch)
        if number == block._emitted:
            block._emitted += 1
            self.next_record += 1
            return (item,)
        return None

    def _read_ahead(self) -> None:
        start = self.next_record
        if start >= len(self.reader):
            raise StopIteration
        sizes = self.reader.index["size"]
        stop = start + 1
        total = int(sizes[start])
        while stop < len(self.reader) and total + int(sizes[stop]) <= _READ_AHEAD:
            total += int(sizes[stop])
            stop += 1
        self.buffer = self.reader.read_many(start, stop)[::-1]
        self.next_record = stop

    def abandon(self) -> None:
        self.buffer = []


class _PositionReader:
    """Asks the position authority for each position, reads that position's records.

    Used where the stream is sharded (workers, ranks): the authority (the
    sharding point) yields exactly this copy's positions, skips what a resume
    skips, and stamps them for the epoch.
    """

    def __init__(
        self, block: Snapshot, reader: RecordReader, authority: int, positions: int | None
    ):
        self.block, self.reader, self.positions = block, reader, positions
        self.authority = block._authority(authority)
        self.pending: list[tuple[int | None, int, Any]] = []
        self.position: int | None = None
        self.given = 0  # records of ``position`` returned
        self.stamp: tuple[int | None, int] = (None, 0)
        if block._resume_group is not None:  # finish the position the checkpoint was in
            self.position, self.given = block._resume_group
            self.stamp = (self.authority.epoch_seed(), block._pl_epoch)
            start, stop = reader.lookup(self.position)
            self.pending = reader.read_many(start + self.given, stop)[::-1]

    def next(self) -> Any:
        while not self.pending:
            item = self.authority.async_next()  # NotAvailable / StopIteration pass through
            if isinstance(item, tuple) and len(item) == 2 and hasattr(item[1], "close"):
                item[1].close()  # an opened stream we do not read
            seed, epoch, position, _ = current_stamp()
            if position is None:
                raise RuntimeError(f"{self.authority!r} gave an item without a position")
            start, stop = self.reader.lookup(position)
            if start == stop and self.positions is not None and position >= self.positions:
                raise RuntimeError(
                    f"{self.block!r}: the snapshot in {self.reader.directory} covers positions "
                    f"0..{self.positions - 1} but {self.authority!r} gave position {position}; the "
                    f"upstream changed in a way the fingerprint did not see. Delete that "
                    f"directory (or change key=) to rebuild it"
                )
            self.stamp, self.position, self.given = (seed, epoch), position, 0
            self.pending = self.reader.read_many(start, stop)[::-1] if stop > start else []
        position, draws, item = self.pending.pop()
        restore_stamp((self.stamp[0], self.stamp[1], position, draws))
        self.given += 1
        self.block._emitted += 1
        return item

    def group(self) -> tuple[int, int] | None:
        """The position being given and how many of its records were (for a checkpoint)."""
        return None if self.position is None or not self.pending else (self.position, self.given)

    def abandon(self) -> None:
        self.pending = []


# ``NotAvailable`` from the source leaves every mode's state as it was: the
# next call asks again (nothing is recorded or counted before an item arrives).
_ = NotAvailable
