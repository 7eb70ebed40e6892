"""What a ``snapshot`` does in one pass: pass through, write, or read back.

A :class:`~pipeloom.datapipes._snapshot.Snapshot` picks one of these at the
first item of each pass. ``NotAvailable`` from upstream leaves each one as it
was (nothing is recorded or counted before an item arrives).
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from ._context import (
    Key,
    current_stamp,
    key_position,
    restore_stamp,
    unwatch_stamps,
    watch_stamps,
)
from ._positions import authority_index
from ._records import RecordReader, RecordWriter
from ._snapshot_store import SnapshotStore
from ._stamp_owners import UNKNOWN, StampOwners, StampTally

if TYPE_CHECKING:
    from ._snapshot import Snapshot

__all__ = ["OrderedReader", "Passthrough", "PositionReader", "Writer"]

_READ_AHEAD = 4 << 20  # bytes of records read at once when replaying in order


class Passthrough:
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


class Writer:
    """Passes the items on and records them; commits when the pass ends."""

    def __init__(
        self, block: Snapshot, store: SnapshotStore, name: str, expected: int, *, watch: bool
    ):
        self.block, self.store, self.name, self.expected = block, store, name, expected
        store.sweep()
        tag = f"e{block._epoch_number()}p{block._passes}"
        self.directory = store.pass_directory(block._run, tag)
        store.start_writer(self.directory, name)
        self.writer = RecordWriter(self.directory, name, block.shard_size << 20)
        index = authority_index(block)
        self.authority = None if index is None else block._authority(index)
        self.observed: list[int] | None = [] if watch else None
        self.root_seed = None
        if watch and self.authority is not None:
            self.root_seed = self.authority.epoch_seed()
        self.stamper: bool | None = None
        self.first_seed: int | None = None
        self.owners = StampOwners(block)
        self.described: dict[int, list[Any]] = {}  # owner: what finds it again (when read)
        self.tally = StampTally()
        self.last_position = -1
        self.ordered = True  # written in the order of the positions (a reader by position)
        self.straddles = False  # a record holds outputs of several positions (see _snapshot)

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
        seed, epoch, key, draws = current_stamp()
        if draws and not block.allow_random:
            raise RuntimeError(
                f"{block!r}: the item at position {key_position(key)} drew from item_rng() "
                f"upstream, so the snapshot would freeze its random augmentation; apply it "
                f"after the .snapshot(...), or pass allow_random=True to freeze it on purpose"
            )
        if self.stamper is None:
            self.first_seed = seed
            self.stamper = self._stamped_by_authority(seed, epoch)
        elif seed != self.first_seed:  # e.g. rounds of a cycle upstream: no single seed
            self.stamper = False
        # Records keep the whole key: output j of a multi-output block upstream is
        # replayed as (p, j), so its item_rng() draws after the snapshot are the live ones.
        position = key_position(key)
        if position is not None:
            self.ordered = self.ordered and position >= self.last_position
            if position != self.last_position and key.__class__ is tuple and key[1]:  # type: ignore[index]
                self.straddles = True  # the position's first outputs are in an earlier record
            self.last_position = position
        owner = self.owners.owner(seed, epoch)
        if owner not in self.described and owner != UNKNOWN:
            self.described[owner] = self.owners.describe(owner)
        self.tally.note(owner, seed)
        self.writer.append(key, draws, item, owner)
        block._emitted += 1
        return item

    def _stamped_by_authority(self, seed: int | None, epoch: int) -> bool:
        authority = self.authority
        return (
            authority is not None
            and authority._round_number() == 0
            and authority._drawn_epoch_seed() == seed
            and epoch == self.block._epoch_number()
        )

    def _finish(self) -> None:
        if not self.tally.replayable:
            self._give_up()
            return
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
            "ordered": self.ordered,
            "straddles": self.straddles,
            "owned": self.tally.owned,
            "owners": {str(owner): found for owner, found in self.described.items()},
        }
        self.store.finish_writer(self.directory, self.name, summary, expected=self.expected)
        self.block._mode = Passthrough(self.block)  # the source is spent: StopIteration again

    def _give_up(self) -> None:
        """Drop what was written: a replay could not stamp the records as they were."""
        self.writer.abort()
        block = self.block
        block._unreplayable = True
        block._mode = Passthrough(block)
        warnings.warn(
            f"{block!r} reads its upstream live and keeps nothing: items of one epoch came "
            f"with seeds of several blocks, not all of them known (a later round of a "
            f".cycle() upstream?), so a replay would give items the same item_rng() draws. "
            f"Move the .cycle() after the .snapshot(...)",
            UserWarning,
            stacklevel=2,
        )

    def abandon(self) -> None:
        self.writer.abort()


class OrderedReader:
    """Replays every record in order (the main process, or a replicated copy)."""

    def __init__(
        self,
        block: Snapshot,
        reader: RecordReader,
        authority: int | None,
        owners: dict[int, list[Any]] | None,
    ) -> None:
        self.block, self.reader = block, reader
        self.stamp: tuple[int | None, int] | None = None
        # Each record gets the seed its stamping block has this epoch (format 5 on) where
        # this graph has every such block; a reader after the workers' merge has not, and
        # learns the stamp from one live item (its authority there is the merge: no seed
        # the items had). Older formats trust the authority of the graph that reads.
        self.owners: StampOwners | None = None
        self.places: dict[int, int] = {}
        if owners is not None and reader.owners is not None:
            finder = StampOwners(block)
            places = finder.resolve(owners)
            if places is not None:
                self.owners, self.places = finder, places
                self.stamp = (None, block._epoch_number())
        elif authority is not None:
            self.stamp = (block._authority(authority).epoch_seed(), block._epoch_number())
        self.buffer: list[tuple[Key | None, int, Any]] = []
        self.buffer_owners: list[int] = []
        self.next_record = block._emitted

    def next(self) -> Any:
        block = self.block
        if self.stamp is None:  # learn the epoch's stamp from one live item
            live = self._live()
            if live is not None:
                return live[0]
        if not self.buffer:
            self._read_ahead()
        key, draws, item = self.buffer.pop()
        seed, epoch = self.stamp  # type: ignore[misc]
        if self.owners is not None:
            seed = self.owners.seed_now(self.places[self.buffer_owners.pop()])
        restore_stamp((seed, epoch, key, draws))
        block._emitted += 1
        return item

    def _live(self) -> tuple[Any] | None:
        block = self.block
        number = block._pulled
        if self.next_record >= len(self.reader):
            raise StopIteration
        item = block._pull()
        seed, epoch, key, _ = current_stamp()
        self.stamp = (seed, epoch)
        if block._random_upstream:
            # the snapshot froze another epoch's order (allow_random): this epoch's first
            # item is not the first record, only its stamp's seed and epoch are wanted
            if isinstance(item, tuple) and len(item) == 2 and hasattr(item[1], "close"):
                item[1].close()  # an opened stream nobody reads
            return None
        position = key_position(key)
        recorded = self.reader.index["position"][number]
        if position is not None and recorded != -1 and position != recorded:
            raise RuntimeError(
                f"{block!r}: the upstream gave position {position} where the snapshot in "
                f"{self.reader.directory} has {recorded}; the upstream changed in a way the "
                f"fingerprint did not see. Delete that directory (or change key=) to rebuild it"
            )
        if number == block._emitted:
            block._emitted += 1
            self.next_record += 1
            return (item,)
        return None

    def _read_ahead(self) -> None:
        start = self.next_record
        if start >= len(self.reader):
            raise StopIteration
        ends = np.cumsum(self.reader.index["size"][start : start + 4096])
        stop = start + max(1, int(np.searchsorted(ends, _READ_AHEAD, "right")))
        self.buffer = self.reader.read_many(start, stop)[::-1]
        if self.owners is not None:
            self.buffer_owners = self.reader.owners[start:stop][::-1].tolist()  # type: ignore[index]
        self.next_record = stop

    def abandon(self) -> None:
        self.buffer = []


class PositionReader:
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
        self.pending: list[tuple[Key | None, int, Any]] = []
        self.position: int | None = None
        self.given = 0  # records of ``position`` returned
        self.stamp: tuple[int | None, int] = (None, 0)
        if block._resume_group is not None:  # finish the position the checkpoint was in
            self.position, self.given = block._resume_group
            self.stamp = (self.authority.epoch_seed(), block._epoch_number())
            start, stop = reader.lookup(self.position)
            self.pending = reader.read_many(start + self.given, stop)[::-1]

    def next(self) -> Any:
        while not self.pending:
            item = self.authority.async_next()  # NotAvailable / StopIteration pass through
            if isinstance(item, tuple) and len(item) == 2 and hasattr(item[1], "close"):
                item[1].close()  # an opened stream we do not read
            seed, epoch, key, _ = current_stamp()
            position = key_position(key)
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
        key, draws, item = self.pending.pop()
        restore_stamp((self.stamp[0], self.stamp[1], key, draws))
        self.given += 1
        self.block._emitted += 1
        return item

    def group(self) -> tuple[int, int] | None:
        """The position being given and how many of its records were (for a checkpoint)."""
        return None if self.position is None or not self.pending else (self.position, self.given)

    def abandon(self) -> None:
        self.pending = []
