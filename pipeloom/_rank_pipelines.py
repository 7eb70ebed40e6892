"""Every rank of a distributed job reads the same pipeline: the check, and its message.

A sharding point splits a stream into shards only if every rank reads the
same stream. One rank listing 998 files where the others list 1,000 (a stale
mount), a shuffle with another buffer size or seed, a rank without its
``sharding_filter()``: the shards then overlap and miss items, and nothing
says so. So the ranks compare their pipelines before the first item: each
describes its pipeline (:func:`rank_description`: the fingerprint a
checkpoint records, ``pipeloom._fingerprint``) once per loader, sends a
short digest of it (:func:`digest`) in a collective it makes anyway, and only
when the digests differ do the ranks exchange the descriptions, so that every
rank raises the same error (:func:`pipelines_differ`) naming the ranks, the
block and the field.

What must match: the blocks' types and order, and every argument the
fingerprint describes (a source's items or their number, seeds, buffer and
batch sizes, functions by name, paths), and how many files a file lister
finds (``listed``: the listing the epoch reads, taken once). What may differ, left out of the
description: a sharding point's settings (the reading service gives each
rank its own shard) and the attributes a block lists in ``per_rank_fields``
(a device, a prefetch depth, a thread count, a timeout, a snapshot's
directory). Anything else that legitimately differs, e.g. the same files
under another mount point on each host (``FileLister.roots``), the user names
in ``pipelines_may_differ``; ``True`` skips the check.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> ranks = [rank_description(IterableWrapper(range(n)).shuffle(), False) for n in (9, 9, 8)]
    >>> digest(ranks[0]) == digest(ranks[1]) != digest(ranks[2])
    True
    >>> message = pipelines_differ(ranks, "DistributedReadingService")
    >>> "rank 2 differs from ranks 0, 1: block #1 IterableWrapper, field iterable" in message
    True
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ._fingerprint import pipeline_fingerprint
from .datapipes import DataPipe, FileLister, FSSpecFileLister
from .graph import traverse

__all__ = ["check_may_differ", "digest", "pipelines_differ", "rank_description"]

_SHOWN_GROUPS = 3  # groups of ranks described in a message; the rest are counted
_SHOWN_BLOCKS = 8  # block names in a chain
_SHOWN_RANKS = 8


def check_may_differ(value: Any, owner: str) -> bool | tuple[str, ...]:
    """``pipelines_may_differ`` checked: ``True``, ``False`` or ``"Block.field"`` names.

    Raises:
        ValueError: anything else.
    """
    if isinstance(value, bool):
        return value
    if not isinstance(value, (list, tuple, set, frozenset)) or not all(
        isinstance(name, str) and _is_field_name(name) for name in value
    ):
        raise ValueError(
            f"{owner}: pipelines_may_differ must be True, False or a list of 'Block.field' "
            f"names of what may differ between the ranks' pipelines (e.g. "
            f"['FileLister.roots']), got {value!r}"
        )
    return tuple(sorted(value)) or False


def _is_field_name(name: str) -> bool:
    kind, _, field = name.rpartition(".")
    return bool(kind) and field.isidentifier()


def rank_description(pipeline: DataPipe, may_differ: bool | tuple[str, ...]) -> dict[str, Any]:
    """What the ranks compare: the pipeline's fingerprint without what may differ.

    Plain lists, dicts and strings (it travels between the ranks).
    """
    if may_differ is True:
        return {"may_differ": True}
    allowed = set(may_differ or ())
    blocks = []
    fingerprint = pipeline_fingerprint(pipeline, across_ranks=True)["blocks"]
    for block, (kind, fields) in zip(traverse(pipeline).nodes, fingerprint):
        if isinstance(block, (FileLister, FSSpecFileLister)) and f"{kind}.listed" not in allowed:
            fields["listed"] = _listed(block)
        blocks.append(
            [kind, {n: text for n, text in fields.items() if f"{kind}.{n}" not in allowed}]
        )
    return {"may_differ": sorted(allowed), "blocks": blocks}


def _listed(lister: FileLister | FSSpecFileLister) -> str:
    """How many files ``lister`` finds (it keeps the listing for the epoch), or why none."""
    try:
        return f"{len(lister)} files"
    except Exception as error:  # noqa: BLE001 - told to every rank; the epoch raises it again
        return f"none: {type(error).__name__}: {str(error)[:200]}"


def digest(description: dict[str, Any]) -> int:
    """A signed 64-bit digest of ``description`` (the same in every process)."""
    text = json.dumps(description, sort_keys=True)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big", signed=True)


def pipelines_differ(descriptions: list[dict[str, Any]], owner: str) -> str:
    """The error message when the ranks' ``descriptions`` (by rank) are not all equal.

    The ranks that agree the most are the reference (on a tie, rank 0's
    group); each other group is named with its first difference. ``owner``
    is what takes ``pipelines_may_differ`` (``"DistributedReadingService"``).
    """
    groups: dict[str, list[int]] = {}
    for rank, description in enumerate(descriptions):
        groups.setdefault(json.dumps(description, sort_keys=True), []).append(rank)
    ordered = sorted(groups.values(), key=lambda ranks: (-len(ranks), ranks[0]))
    reference, others = ordered[0], ordered[1:]
    lines = []
    names: set[str] | None = set()  # None: only True allows the differences
    for ranks in others:
        text, differing = _first_difference(
            descriptions[reference[0]], descriptions[ranks[0]], _ranks(reference), _ranks(ranks)
        )
        verb = "differs" if len(ranks) == 1 else "differ"
        lines.append(f"{_ranks(ranks)} {verb} from {_ranks(reference)}: {text}")
        names = None if names is None or differing is None else names | differing
    if len(lines) > _SHOWN_GROUPS:
        lines[_SHOWN_GROUPS:] = [f"and {len(lines) - _SHOWN_GROUPS} more groups of ranks"]
    allow = repr(sorted(names)) if names else "True"
    return (
        "the ranks' pipelines differ, so the sharding would neither split the data nor "
        "cover it (items read twice or never, silently):\n  "
        + "\n  ".join(lines)
        + "\nBuild the same pipeline over the same data on every rank: the same code, "
        "arguments and files (look for another data version or a stale mount on the "
        "differing ranks); blocks are numbered from the output, #0. If the difference is "
        f"intended, pass {owner}(pipelines_may_differ={allow}) on every rank"
    )


def _first_difference(
    ours: dict[str, Any], theirs: dict[str, Any], we: str, they: str
) -> tuple[str, set[str] | None]:
    """The first difference, in words, and the ``Block.field`` names that differ (None
    when only ``pipelines_may_differ=True`` allows it)."""
    if ours["may_differ"] != theirs["may_differ"]:
        return (
            f"pipelines_may_differ={_allowed(theirs)} on {they}, {_allowed(ours)} on {we} "
            f"(pass the same on every rank)",
            None,
        )
    kinds = [kind for kind, _ in ours["blocks"]], [kind for kind, _ in theirs["blocks"]]
    if kinds[0] != kinds[1]:
        at = next((i for i, (a, b) in enumerate(zip(*kinds)) if a != b), min(map(len, kinds)))
        return (
            f"block #{at} is {_kind_at(kinds[1], at)} on {they} but {_kind_at(kinds[0], at)} "
            f"on {we} ({they}: {len(kinds[1])} blocks, {_chain(kinds[1])}; {we}: "
            f"{len(kinds[0])}, {_chain(kinds[0])})",
            None,
        )
    changes = [
        (index, kind, name, fields.get(name, "(absent)"), mine.get(name, "(absent)"))
        for index, ((kind, fields), (_, mine)) in enumerate(zip(theirs["blocks"], ours["blocks"]))
        for name in sorted(set(fields) | set(mine))
        if fields.get(name) != mine.get(name)
    ]
    index, kind, name, there, here = changes[0]
    more = f" (and {len(changes) - 1} more differing fields)" if len(changes) > 1 else ""
    return (
        f"block #{index} {kind}, field {name}: {there} on {they}, {here} on {we}{more}",
        {f"{k}.{n}" for _, k, n, _, _ in changes},
    )


def _allowed(description: dict[str, Any]) -> str:
    value = description["may_differ"]
    return repr(value) if value is True or value else "False"


def _kind_at(kinds: list[str], index: int) -> str:
    return kinds[index] if index < len(kinds) else "missing"


def _chain(kinds: list[str]) -> str:
    shown = " <- ".join(kinds[:_SHOWN_BLOCKS])
    return shown + (" <- ..." if len(kinds) > _SHOWN_BLOCKS else "")


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    shown = ", ".join(str(rank) for rank in ranks[:_SHOWN_RANKS])
    more = len(ranks) - _SHOWN_RANKS
    return f"ranks {shown}" + (f" and {more} more" if more > 0 else "")
