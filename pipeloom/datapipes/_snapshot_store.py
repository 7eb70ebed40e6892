"""The on-disk layout of snapshots and how one is committed, atomically.

Under the snapshot's ``path``::

    <fingerprint>/                       a complete snapshot (only ever renamed into place)
        manifest.json                    what it holds and where it came from
        index.npy  files.txt             every record's position and place
        w0000-00000.rec ...              the records, in files of bounded size
    .tmp-<fingerprint>-<run>-<pass>/     a snapshot being written by one pass

Each writer (the process or each worker producing the items) writes its
records and index into the pass's temporary directory and then its own
``writer-<name>.json``. The writer that finds every expected writer done
checks that together they saw every position of the epoch, merges the
indexes, writes ``manifest.json`` and renames the directory to
``<fingerprint>``: a reader sees a whole snapshot or none. A writer killed
midway leaves only a temporary directory, which nobody reads; it is removed
when its process is found dead (same host), or when a later pass of the same
run commits.

Example:
    >>> import tempfile
    >>> store = SnapshotStore(tempfile.mkdtemp(), "0123abcd")
    >>> store.is_complete()
    False
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import socket
import threading
import time
from typing import Any

import numpy as np

from . import _npy
from ._records import checksums, combine, damaged

__all__ = ["SnapshotStore", "manifest_owners", "run_name"]

FORMAT = 5
KEYED_FORMAT = 2  # from this format on, records keep their key's rest (see _records.py)
CHECKED_FORMAT = 3  # from this format on, the index holds each record's CRC-32
SEALED_FORMAT = 4  # from this format on, the manifest holds the CRC-32 of index.npy, files.txt
# from this format on, the index names each record's stamping block (``owner``), and the
# manifest says whether every record's is known (``owned``)
OWNED_FORMAT = 5
_LOG = logging.getLogger("pipeloom.snapshot")


def _owners(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's ``owned`` and ``owners``: every writer knew each record's stamping block,
    and the writers agree on what finds each one again (``_stamp_owners.py``)."""
    owners: dict[str, Any] = {}
    owned = all(summary["owned"] for summary in summaries)
    for summary in summaries:
        for owner, described in summary["owners"].items():
            owned = owned and owners.setdefault(owner, described) == described
    return {"owned": owned, "owners": owners}


def manifest_owners(manifest: dict[str, Any]) -> dict[int, list[Any]] | None:
    """``{owner: [class name, place]}`` of a manifest whose records name their stamping
    blocks (format 5 on); None where they do not, or do not all."""
    owners = manifest.get("owners")
    if manifest.get("owned") is not True or not isinstance(owners, dict):
        return None
    try:
        return {int(owner): [str(kind), place] for owner, (kind, place) in owners.items()}
    except (TypeError, ValueError):
        return None


def run_name() -> str:
    """A name for one process's writes: host, pid and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(4).hex()}"


class SnapshotStore:
    """The snapshots of one fingerprint under ``root``."""

    def __init__(self, root: str, digest: str) -> None:
        self.root = root
        self.digest = digest
        self.final = os.path.join(root, digest)

    def is_complete(self) -> bool:
        """True when a committed snapshot of this fingerprint exists."""
        return os.path.exists(os.path.join(self.final, "manifest.json"))

    def manifest(self) -> dict[str, Any]:
        """The committed snapshot's manifest, checked (OSError if it is damaged)."""
        try:
            with open(os.path.join(self.final, "manifest.json")) as file:
                manifest = json.load(file)
        except (OSError, ValueError) as error:
            raise damaged(self.final, f"manifest.json cannot be read ({error})") from error
        fields = {"format": int, "records": int, "stamper": bool}
        wrong = [
            name
            for name, kind in fields.items()
            if not isinstance(manifest, dict) or not isinstance(manifest.get(name), kind)
        ]
        if wrong:
            raise damaged(self.final, f"manifest.json lacks {', '.join(wrong)}")
        if not 1 <= manifest["format"] <= FORMAT:
            raise damaged(
                self.final,
                f"manifest.json has format {manifest['format']}; this pipeloom reads formats "
                f"1 to {FORMAT} (a newer pipeloom wrote it?)",
            )
        sealed = manifest.get("checksums")
        if manifest["format"] >= SEALED_FORMAT and not (
            isinstance(sealed, dict)
            and sorted(sealed) == ["files.txt", "index.npy"]
            and all(type(crc) is int for crc in sealed.values())
        ):
            raise damaged(
                self.final,
                f"manifest.json has format {manifest['format']} but no CRC-32 of index.npy and "
                f"files.txt ('checksums': {str(sealed)[:80]})",
            )
        return manifest

    def others(self) -> list[tuple[str, dict[str, Any]]]:
        """Committed snapshots of other fingerprints, newest first."""
        found = []
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        for name in names:
            if name.startswith(".") or name == self.digest:
                continue
            try:
                with open(os.path.join(self.root, name, "manifest.json")) as file:
                    found.append((name, json.load(file)))
            except (OSError, ValueError):
                continue
        return sorted(found, key=lambda entry: -float(entry[1].get("created", 0)))

    # -- writing ---------------------------------------------------------------
    def pass_directory(self, run: str, tag: str) -> str:
        """The temporary directory the writers of one pass share (created if needed)."""
        path = os.path.join(self.root, f".tmp-{self.digest}-{run}-{tag}")
        os.makedirs(path, exist_ok=True)
        return path

    def sweep(self) -> None:
        """Remove temporary directories whose writing process died (on this host)."""
        host = socket.gethostname()
        prefix = f".tmp-{self.digest}-{host}-"
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return
        for name in names:
            if not name.startswith(prefix):
                continue
            pid = name[len(prefix) :].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)

    def start_writer(self, directory: str, name: str) -> None:
        """Forget what writer ``name`` finished in an abandoned pass of the same tag.

        Under the commit lock, so a committing writer never counts (and never
        moves) files this writer is about to rewrite.
        """
        with _CommitLock(directory) as locked:
            if locked:
                for stale in (f"writer-{name}.json", f"observed-{name}.npy", f"index-{name}.npy"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(directory, stale))

    def finish_writer(
        self, directory: str, name: str, summary: dict[str, Any], *, expected: int
    ) -> bool:
        """Record that writer ``name`` is done; commit when all ``expected`` writers are.

        Returns True when this call committed the snapshot.
        """
        _write_json(os.path.join(directory, f"writer-{name}.json"), summary)
        with _CommitLock(directory) as locked:
            if not locked or not os.path.exists(os.path.join(directory, f"writer-{name}.json")):
                return False  # another writer committed and moved the directory meanwhile
            writers = sorted(
                f[len("writer-") : -len(".json")]
                for f in os.listdir(directory)
                if f.startswith("writer-") and f.endswith(".json")
            )
            if len(writers) < expected:
                return False
            return self._commit(directory, writers)

    def _commit(self, directory: str, writers: list[str]) -> bool:
        summaries = []
        for name in writers:
            with open(os.path.join(directory, f"writer-{name}.json")) as file:
                summaries.append(json.load(file))
        observed = [s["observed"] for s in summaries]
        positions = None
        if all(o is not None for o in observed):
            positions = _covered_positions(directory, writers)
            if positions == 0:  # no position seen proves nothing: an empty epoch, or the
                # empty rest of a resumed one (a rank's share of positions 2, 5, ...)
                _LOG.info("snapshot %s not committed: no writer saw a position", self.final)
                shutil.rmtree(directory, ignore_errors=True)
                return False
            if positions is None:
                _LOG.warning(
                    "snapshot %s not committed: the writers of this epoch did not see every "
                    "position from 0 on (the epoch resumed from a checkpoint, or ran on one "
                    "rank of several); a later full epoch writes it",
                    self.final,
                )
                shutil.rmtree(directory, ignore_errors=True)
                return False
        # in position order for a reader by position, where every record is one of the
        # authority's positions and each writer wrote them in that order; else as written
        # (a concat's sources would interleave, a shuffle's order would be lost)
        stamper = all(s["stamper"] for s in summaries)
        ordered = all(s["ordered"] for s in summaries)
        by_position = stamper and ordered and (len(writers) > 1 or positions is not None)
        records = combine(directory, writers, sort=by_position)
        first = summaries[0]
        manifest = {
            "format": FORMAT,
            "fingerprint": self.digest,
            "blocks": first["blocks"],
            "records": records,
            "checksums": checksums(directory),
            "positions": positions,
            "stamper": stamper,
            "ordered": ordered,
            "straddles": any(s["straddles"] for s in summaries),
            **_owners(summaries),
            "writers": writers,
            "bytes": sum(s["bytes"] for s in summaries),
            "created": time.time(),
        }
        _write_json(os.path.join(directory, "manifest.json"), manifest)
        try:
            os.rename(directory, self.final)
        except OSError:  # another run committed the same fingerprint first
            shutil.rmtree(directory, ignore_errors=True)
            return False
        self._remove_own_leftovers(directory)
        _LOG.info(
            "snapshot %s committed: %d records, %d bytes", self.final, records, manifest["bytes"]
        )
        return True

    def _remove_own_leftovers(self, committed: str) -> None:
        run = os.path.basename(committed).rsplit("-", 1)[0]
        for name in os.listdir(self.root):
            if name.startswith(run + "-"):
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)


class _CommitLock:
    """An exclusive ``flock`` on a pass directory's ``.commit.lock``; False if it is gone."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, ".commit.lock")
        self.fd = -1

    def __enter__(self) -> bool:
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            return False
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return True

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _covered_positions(directory: str, writers: list[str]) -> int | None:
    """N when the writers together saw each position 0..N-1 exactly once, else None."""
    parts = [_npy.load(os.path.join(directory, f"observed-{name}.npy")) for name in writers]
    seen = np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
    if not np.array_equal(seen, np.arange(len(seen))):
        return None
    return len(seen)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_json(path: str, value: Any) -> None:
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.{os.getpid()}-{threading.get_ident()}.partial")
    with open(temporary, "w") as file:
        json.dump(value, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
