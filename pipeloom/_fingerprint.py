"""A pipeline's fingerprint: what a checkpoint records so it resumes only where it belongs.

A state holds positions ("item 150 of the source", "the buffer of this
shuffle"). Loaded into a different pipeline -- the same code over a smaller
dataset, a shuffle with another buffer -- those positions point at other data,
and training would go on, silently, on the wrong items. So a loader's state
carries a *fingerprint*: for each block (in the order of
``pipeloom.graph.traverse``), its type and a short description of each of its
public, non-block attributes -- the arguments it was built with. Describing is
cheap and stable across processes and runs: scalars and short strings as
their ``repr``, functions by their qualified name (never a repr with a memory
address), a ``functools.partial`` by its function and the arguments it
binds, containers and datasets by type and ``len()`` (never iterated),
anything else by its type.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> saved = pipeline_fingerprint(IterableWrapper(range(200)).shuffle(buffer_size=8))
    >>> now = pipeline_fingerprint(IterableWrapper(range(50)).shuffle(buffer_size=8))
    >>> fingerprint_differences(saved, now)
    ['block #1 IterableWrapper: saved iterable=range(0, 200), now range(0, 50)']
"""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np
import torch

from .datapipes import DataPipe, StreamReader
from .graph import traverse

__all__ = [
    "data_differences",
    "data_fingerprint",
    "describe",
    "field_differences",
    "fingerprint_differences",
    "pipeline_fingerprint",
    "unchecked_data",
]

_PARTIAL = "functools.partial("
_SHORT = 200  # longer strings are described by their length
_FEW = 8  # longer containers are described by their length


def pipeline_fingerprint(pipeline: DataPipe, *, across_ranks: bool = False) -> dict[str, Any]:
    """``{"blocks": [[type name, {attribute: description}], ...]}`` for ``pipeline``.

    Plain strings, lists and dicts: it travels inside the loader's state.
    ``across_ranks`` leaves out what may differ between the ranks of a job:
    a sharding point's settings (each rank's and worker's shard) and the
    attributes a block lists in ``per_rank_fields`` (a device, a timeout),
    and the arguments a ``functools.partial`` binds (``partial(move, device=rank)``).
    Otherwise ``"may_change"`` lists, per block, the attributes a state may be
    loaded with changed (``resume_may_change``, e.g. ``mux``'s weights), which
    :func:`fingerprint_differences` does not compare.
    """
    blocks, may_change = [], []
    for block in traverse(pipeline).nodes:
        may_change.append(list(type(block).resume_may_change))
        fields = {}
        local = _per_rank(block) if across_ranks else ()
        for name, value in sorted(vars(block).items()):
            if name.startswith("_") or name in block.inputs or _holds_blocks(value):
                continue
            if name in local:
                continue
            fields[name] = describe(value, partial_arguments=not across_ranks)
        blocks.append([type(block).__qualname__, fields])
    if across_ranks or not any(may_change):
        return {"blocks": blocks}
    return {"blocks": blocks, "may_change": may_change}  # not compared: see below


def data_fingerprint(pipeline: DataPipe, *, contents: bool | None = None) -> list[list[Any]]:
    """``[[f"block #{i} {type}", description], ...]`` of the data the sources read.

    For each block whose ``describe_data(contents=...)`` describes something (a
    file lister, or a list of paths: the paths; with ``contents``, each file's
    size and time, asked when a reader resumes in the middle of files;
    ``contents=None``: when the pipeline has such a reader). Unlike the
    arguments, this is learned from the data, so it is taken when the state is.
    """
    nodes = traverse(pipeline).nodes
    if contents is None:
        contents = any(isinstance(block, StreamReader) for block in nodes)
    described = []
    for index, block in enumerate(nodes):
        describe_data = getattr(block, "describe_data", None)
        if callable(describe_data) and (found := describe_data(contents=contents)) is not None:
            described.append([f"block #{index} {type(block).__qualname__}", found])
    return described


def data_differences(saved: Any, pipeline: DataPipe) -> list[str]:
    """What changed in ``pipeline``'s data since ``saved`` (``data_fingerprint``'s).

    A state saved before the data was recorded (``saved`` None) has nothing to compare.
    """
    if saved is None:
        return []
    if not isinstance(saved, (list, tuple)) or not all(
        isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[1], dict)
        for entry in saved
    ):
        return ["the state's record of the data is damaged (expected [[block, {...}], ...])"]
    was = {str(label): description for label, description in saved}
    lines = []
    for index, block in enumerate(traverse(pipeline).nodes):
        label = f"block #{index} {type(block).__qualname__}"
        changed_data = getattr(block, "changed_data", None)
        if label in was and callable(changed_data):
            lines += [f"{label}: {line}" for line in changed_data(was[label])]
    return lines


def unchecked_data(pipeline: DataPipe) -> list[str]:
    """``block #i Type: why`` for each block whose data a resume cannot check (its
    ``unchecked_data()``: e.g. ``list_files`` over a stream of roots)."""
    lines = []
    for index, block in enumerate(traverse(pipeline).nodes):
        unchecked = getattr(block, "unchecked_data", None)
        if callable(unchecked) and (why := unchecked()):
            lines.append(f"block #{index} {type(block).__qualname__}: {why}")
    return lines


def describe(value: Any, *, partial_arguments: bool = True) -> str:
    """A short, stable description of an argument (see the module docstring).

    Example:
        >>> describe(range(3)), describe([1, 2]), describe(list(range(100))), describe(len)
        ('range(0, 3)', '[1, 2]', 'list of 100 items', 'len')
    """
    if _is_scalar(value) or isinstance(value, range):
        return repr(value)
    if isinstance(value, str):  # long
        return f"str of length {len(value)}"
    if isinstance(value, (bytes, bytearray)):
        return f"{type(value).__name__} of length {len(value)}"
    if isinstance(value, functools.partial):
        bound = [describe(value.func)]
        if partial_arguments:
            bound += [describe(arg) for arg in value.args]
            bound += [f"{key}={describe(arg)}" for key, arg in sorted(value.keywords.items())]
        return f"{_PARTIAL}{', '.join(bound)})"
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type)):
        name = getattr(value, "__qualname__", None)
        return name if isinstance(name, str) else str(type(value).__qualname__)
    if isinstance(value, (list, tuple)):
        if len(value) <= _FEW and all(_is_scalar(x) for x in value):
            return repr(value)
        return f"{type(value).__name__} of {len(value)} items"
    if isinstance(value, dict):
        if len(value) <= _FEW and all(_is_scalar(k) and _is_scalar(v) for k, v in value.items()):
            return repr(dict(sorted(value.items(), key=lambda kv: repr(kv[0]))))
        return f"dict of {len(value)} items"
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return f"{type(value).__name__} of shape {tuple(value.shape)}, {value.dtype}"
    name = type(value).__qualname__
    try:
        return f"{name} of {len(value)} items"
    except Exception:  # noqa: BLE001 - no (cheap) length: the type says enough
        return name


def fingerprint_differences(saved: Any, now: dict[str, Any]) -> list[str]:
    """What differs between a saved fingerprint and the current pipeline's, one line each."""
    if not isinstance(saved, dict) or not _well_formed(saved.get("blocks")):
        return ["the state's fingerprint is damaged (expected {'blocks': [[type, {...}], ...]})"]
    old, new = saved["blocks"], now["blocks"]
    if [b[0] for b in old] != [b[0] for b in new]:
        return [
            f"the state was saved from a pipeline of {len(old)} blocks "
            f"({_chain(old)}); this one has {len(new)} ({_chain(new)})"
        ]
    lines = []
    adapts = now.get("may_change") or [[]] * len(new)
    for index, ((kind, was), (_, is_now)) in enumerate(zip(old, new)):
        changed = [
            f"{name}={a}, now {b}"
            for name, a, b in _changed(was, is_now)
            if name not in adapts[index]
        ]
        if changed:
            lines.append(f"block #{index} {kind}: saved " + "; saved ".join(changed))
    return lines


def field_differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``"name: saved X, now Y"`` for each field whose description changed.

    Example:
        >>> field_differences({"dataset": "list of 9 items"}, {"dataset": "list of 4 items"})
        ['dataset: saved list of 9 items, now list of 4 items']
    """
    return [f"{name}: saved {a}, now {b}" for name, a, b in _changed(saved, now)]


def _changed(was: dict[str, Any], now: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    return [
        (name, was.get(name, "(absent)"), now.get(name, "(absent)"))
        for name in sorted(set(was) | set(now), key=str)
        if not _same(was.get(name), now.get(name))
    ]


def _same(saved: Any, now: Any) -> bool:
    """Equal descriptions; a partial described as ``partial(f)`` (states saved before
    partials listed their arguments) matches any partial of ``f``."""
    if saved == now:
        return True
    if not (isinstance(saved, str) and isinstance(now, str)) or not now.startswith(_PARTIAL):
        return False
    if not (saved.startswith("partial(") and saved.endswith(")")):
        return False
    function = saved[len("partial(") : -1]
    return now == f"{_PARTIAL}{function})" or now.startswith(f"{_PARTIAL}{function}, ")


# What a reading service sets on a sharding point for each rank and worker.
_SHARD_SETTINGS = ("total", "index", "group_size", "num_shards", "shard_index")


def _per_rank(block: DataPipe) -> tuple[str, ...]:
    shard = _SHARD_SETTINGS if block.is_shardable() else ()
    return (*shard, *type(block).per_rank_fields)


def _is_scalar(value: Any) -> bool:
    if isinstance(value, str):
        return len(value) <= _SHORT
    return value is None or isinstance(value, (bool, int, float))


def _holds_blocks(value: Any) -> bool:
    """A block, or a container whose first element is one (as the graph sees inputs):
    a look at one element, so a list of 2M indices costs nothing."""
    if isinstance(value, DataPipe):
        return True
    if isinstance(value, (list, tuple)):
        return bool(value) and isinstance(value[0], DataPipe)
    if isinstance(value, dict):
        return bool(value) and isinstance(next(iter(value.values())), DataPipe)
    return False


def _well_formed(blocks: Any) -> bool:
    return isinstance(blocks, (list, tuple)) and all(
        isinstance(b, (list, tuple))
        and len(b) == 2
        and isinstance(b[0], str)
        and isinstance(b[1], dict)
        for b in blocks
    )


def _chain(blocks: Any, limit: int = 8) -> str:
    names = [b[0] for b in blocks]
    shown = " <- ".join(names[:limit])
    return shown + (" <- ..." if len(names) > limit else "")
