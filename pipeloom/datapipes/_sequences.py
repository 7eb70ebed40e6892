"""Variable-length sequences as ``pack``, ``concat_then_split`` and ``padded_batch`` see them.

An item is either

* a *sequence*: a tensor or NumPy array with at least one dimension, or a
  list/tuple of numbers; its length is its first dimension; or
* a *dict* whose sequence values are its *fields* (``input_ids``,
  ``labels``, ...) and whose other values (numbers, strings) are *metadata*.

Outputs are torch tensors: a field keeps its dtype (lists of ints become
int64; items of different dtypes give the dtype they promote to, as
``torch.stack`` does), ``segment_ids`` and ``positions`` are int64. A
``pad_value`` the field's dtype cannot hold (-1 in uint8, 0.5 in int64) is
refused rather than stored as another number.

Example:
    >>> pack_segments([([5, 6], 0, 2), ([7], 0, 1)], 4, 0, "pack")
    (tensor([5, 6, 7, 0]), tensor([1, 1, 2, 0]), tensor([0, 1, 0, 0]))
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ._context import output_stamp
from ._state_fields import StateFields

__all__ = [
    "PadValue",
    "check_pad_keys",
    "check_pad_value",
    "check_same_keys",
    "entry_tensor",
    "is_sequence",
    "item_length",
    "pack_segments",
    "padding",
    "pad_for",
    "piece_stamp",
    "saved_lengths",
    "sequence_keys",
    "slice_item",
    "to_tensor",
]

PadValue = float | int | Mapping[str, float | int]
RESERVED = ("segment_ids", "positions")


def is_sequence(value: Any) -> bool:
    """True for a tensor/array with a dimension, or a list/tuple (not a string)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.ndim >= 1
    return isinstance(value, (list, tuple))


def sequence_keys(item: Mapping[str, Any]) -> list[str]:
    """The keys of ``item`` that hold sequences (its fields), in the item's order."""
    return [key for key, value in item.items() if is_sequence(value)]


def item_length(item: Any, owner: str, length_key: str | None = None) -> int:
    """The length of an item; for a dict, of ``length_key`` (default: every field agrees).

    Raises:
        TypeError: the item is neither a sequence nor a dict with a sequence field.
        ValueError: a dict's fields differ in length (and no ``length_key`` says
            which one counts).
    """
    if isinstance(item, Mapping):
        keys = sequence_keys(item)
        if not keys:
            raise TypeError(
                f"{owner}() needs sequences (tensors, arrays, lists) or dicts holding them, "
                f"got a dict with no sequence value (keys {sorted(map(str, item))})"
            )
        if length_key is not None:
            if length_key not in item or not is_sequence(item[length_key]):
                raise ValueError(
                    f"{owner}() was told length_key={length_key!r}, but the item has no "
                    f"sequence under that key (its sequence keys: {keys})"
                )
            return len(item[length_key])
        lengths = {key: len(item[key]) for key in keys}
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"{owner}() packs the fields of a dict side by side, so they must have one "
                f"length, got {lengths}; drop or pad the odd field in a .map() first"
            )
        return lengths[keys[0]]
    if not is_sequence(item):
        raise TypeError(
            f"{owner}() needs sequences (1-D tensors, arrays, lists of numbers) or dicts "
            f"holding them, got {type(item).__name__} {_short(item)}"
        )
    return len(item)


def saved_lengths(fields: StateFields, name: str, items: list[Any], owner: str) -> list[int]:
    """The lengths of the sequences a saved state holds in field ``name``, each >= 1.

    Raises:
        StateError: one is no sequence (or dict of them) or is empty: a block
            never holds such an item, so the state is damaged.
    """
    lengths = []
    for item in items:
        try:
            lengths.append(item_length(item, owner))
        except (TypeError, ValueError):
            fields.fail(name, "a list of sequences (or dicts of them), as they came", item)
        if not lengths[-1]:
            fields.fail(name, "a list of non-empty sequences (empty ones are dropped)", item)
    return lengths


def slice_item(item: Any, start: int, stop: int) -> Any:
    """A copy of positions ``[start, stop)`` of an item (metadata kept as is)."""
    if isinstance(item, Mapping):
        return {
            key: _slice(value, start, stop) if is_sequence(value) else value
            for key, value in item.items()
        }
    return _slice(item, start, stop)


def _slice(value: Any, start: int, stop: int) -> Any:
    part = value[start:stop]
    if isinstance(part, (torch.Tensor, np.ndarray)):
        return part.copy() if isinstance(part, np.ndarray) else part.clone()
    return part  # a list/tuple slice is already a copy


def entry_tensor(value: Any, owner: str, what: str) -> torch.Tensor:
    """``to_tensor(value)`` for a sequence entry of ``what``, or an error that says what to do.

    Raises:
        TypeError: ``value`` is no sequence (``what`` is one in another item), or
            holds what torch cannot read as numbers (strings: text not tokenized).
    """
    if not is_sequence(value):
        raise TypeError(
            f"{owner}() needs the {what} entries to be sequences (tensors, arrays, lists), "
            f"but one is {type(value).__name__} {_short(value)}; give every item a sequence "
            f"there, or the same kind of value in each"
        )
    try:
        return to_tensor(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(
            f"{owner}() needs the {what} entries to hold numbers (token ids), but torch cannot "
            f"read {_short(value)} as a tensor ({error}); tokenize or convert it in a .map() "
            f"first"
        ) from error


def to_tensor(value: Any) -> torch.Tensor:
    """``value`` as a tensor: tensors as they are, arrays shared, lists converted."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if not value.flags.writeable:
            value = value.copy()
        return torch.from_numpy(value)
    return torch.tensor(value)


def check_pad_value(owner: str, pad_value: Any) -> None:
    """Raise TypeError unless ``pad_value`` is a number or a mapping of key -> number."""
    values = pad_value.values() if isinstance(pad_value, Mapping) else [pad_value]
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(
                f"{owner}() expects pad_value to be a number or a dict of key -> number "
                f"(e.g. {{'input_ids': 0, 'labels': -100}}), got {pad_value!r}"
            )


def check_same_keys(items: Sequence[Any], owner: str, where: str) -> None:
    """Raise unless ``items`` are all dicts with the first's keys, or all not dicts.

    A row or batch is laid out from its first item's keys: a key only a later
    item has would be dropped without a word, one it lacks would be a bare
    ``KeyError``.

    Raises:
        ValueError: a dict lacks a key of the first item, or has one it lacks.
        TypeError: dicts and plain sequences are mixed.
    """
    first, fix = items[0], "give every item the same keys (add or drop fields in a .map() first)"
    for item in items[1:]:
        if isinstance(item, Mapping) != isinstance(first, Mapping):
            kinds = sorted({type(first).__name__, type(item).__name__})
            raise TypeError(
                f"{owner}() got a {where} mixing dicts and plain sequences "
                f"({' and '.join(kinds)}); give every item one form, e.g. "
                f".map(lambda x: {{'input_ids': x}}) on the plain ones"
            )
        if not isinstance(first, Mapping) or item.keys() == first.keys():
            continue
        missing = [key for key in first if key not in item]
        if missing:
            raise ValueError(
                f"{owner}() got a {where} whose items differ: the first has key "
                f"{missing[0]!r}, another item lacks it; {fix}"
            )
        extra = next(key for key in item if key not in first)
        raise ValueError(
            f"{owner}() got a {where} whose items differ: another item has key {extra!r}, "
            f"the first lacks it (it would be dropped); {fix}"
        )


def check_pad_keys(owner: str, pad_value: PadValue, item: Any) -> None:
    """Raise ValueError if a ``pad_value`` dict names no sequence field of ``item``.

    A misspelt key (``"label"`` for ``"labels"``) would otherwise pad that
    field with 0 -- a real token id -- without a word.
    """
    if not isinstance(pad_value, Mapping):
        return
    if not isinstance(item, Mapping):
        raise ValueError(
            f"{owner}() got pad_value={dict(pad_value)!r}, a dict of field -> padding, but "
            f"the items are plain sequences ({type(item).__name__}), not dicts; pass one "
            f"number, e.g. pad_value=0"
        )
    fields = sequence_keys(item)
    unknown = [key for key in pad_value if key not in fields]
    if unknown:
        raise ValueError(
            f"{owner}() got pad_value for {unknown}, but the items' sequence fields are "
            f"{fields}; name fields the items have (a misspelt one would be padded with 0)"
        )


def piece_stamp(stamp: tuple, start: int) -> tuple:
    """The stamp of the piece of a sequence that starts at token ``start``.

    The piece at 0 keeps the sequence's stamp; a later one is an output of its
    own, key ``(key, start)``, so ``item_rng()`` draws afresh for each row cut
    from one long document rather than repeating the same numbers.
    """
    return output_stamp(stamp, start) if start else stamp  # type: ignore[arg-type]


def pad_for(pad_value: PadValue, key: str | None) -> float | int:
    """The padding value of field ``key`` (0 when a mapping does not name it)."""
    if isinstance(pad_value, Mapping):
        return pad_value.get(key, 0) if key is not None else 0
    return pad_value


def pack_segments(
    segments: Sequence[tuple[Any, int, int]], length: int, pad_value: PadValue, owner: str
) -> Any:
    """Lay ``(item, start, stop)`` segments end to end in one row of ``length``.

    A sequence row is ``(values, segment_ids, positions)``; a dict row has the
    fields laid out, ``segment_ids`` and ``positions`` added, and each
    metadata key mapped to the list of its segments' values. Segment ids count
    from 1 in order (0 is padding); positions restart at 0 in each segment.
    """
    segment_ids = torch.zeros(length, dtype=torch.int64)
    positions = torch.zeros(length, dtype=torch.int64)
    offset = 0
    for number, (_, start, stop) in enumerate(segments, 1):
        size = stop - start
        segment_ids[offset : offset + size] = number
        positions[offset : offset + size] = torch.arange(size)
        offset += size
    first = segments[0][0]
    check_same_keys([item for item, _, _ in segments], owner, "row")
    check_pad_keys(owner, pad_value, first)
    if not isinstance(first, Mapping):
        parts = [(entry_tensor(item, owner, "sequence"), a, b) for item, a, b in segments]
        values = _lay_out(parts, length, pad_for(pad_value, None), "sequence", owner)
        return values, segment_ids, positions
    row: dict[str, Any] = {}
    for key, sample in first.items():
        if is_sequence(sample):
            parts = [(entry_tensor(item[key], owner, repr(key)), a, b) for item, a, b in segments]
            row[key] = _lay_out(parts, length, pad_for(pad_value, key), repr(key), owner)
        else:
            row[key] = [item[key] for item, _, _ in segments]
    for key in RESERVED:
        if key in row:
            raise ValueError(
                f"items already have a {key!r} field, which packing adds; rename it first"
            )
    row["segment_ids"], row["positions"] = segment_ids, positions
    return row


def padding(
    shape: Sequence[int], pad: float | int, tensors: Sequence[torch.Tensor], what: str
) -> torch.Tensor:
    """``torch.full(shape, pad)`` in the dtype ``tensors`` promote to (as ``torch.stack``
    promotes), so copying them in loses nothing; a ``pad`` that dtype cannot hold is refused.

    Raises:
        TypeError: dtypes torch does not promote (uint16 with int64), named.
        ValueError: ``pad`` would be stored as another number (-1 in uint8 as 255,
            0.5 in int64 as 0, 1e6 in float16 as inf); ``what`` names the entries.
    """
    # An entry without values (torch reads ``[]`` as float32) has nothing to keep.
    filled = [tensor for tensor in tensors if tensor.numel()] or tensors
    dtypes = list(dict.fromkeys(tensor.dtype for tensor in filled))
    try:
        dtype = functools.reduce(torch.promote_types, dtypes)
    except RuntimeError as error:  # torch promotes no uint16/32/64 with another dtype
        raise TypeError(
            f"the {what} entries have dtypes {dtypes}, which torch does not promote to one "
            f"(torch said: {error}); convert them to one dtype in a .map first "
            f"(e.g. .astype(np.int64) or .to(torch.int64))"
        ) from error
    if dtype == torch.bool:
        fits = pad in (0, 1)
    elif dtype.is_floating_point:
        fits = not math.isfinite(pad) or abs(pad) <= torch.finfo(dtype).max
    elif dtype.is_complex:
        fits = True
    else:
        info = torch.iinfo(dtype)
        fits = float(pad).is_integer() and info.min <= pad <= info.max
    if not fits:
        raise ValueError(
            f"pad_value {pad!r} does not fit the {what} entries, of dtype {dtype} (it would "
            f"be stored as another number); pass a pad_value that {dtype} holds (e.g. 0), or "
            f"convert those entries to a wider dtype in a .map first"
        )
    return torch.full(tuple(shape), pad, dtype=dtype)


def _lay_out(
    parts: list[tuple[torch.Tensor, int, int]], length: int, pad: Any, what: str, owner: str
) -> torch.Tensor:
    first = parts[0][0]
    if len({tuple(part[0].shape[1:]) for part in parts}) > 1:
        raise ValueError(
            f"{owner}() lays sequences end to end along their first dimension, but the {what} "
            f"entries differ after it: shapes {[tuple(part[0].shape) for part in parts]}; "
            f"give them one shape past the first dimension in a .map() first"
        )
    out = padding((length, *first.shape[1:]), pad, [part[0] for part in parts], what)
    offset = 0
    for tensor, start, stop in parts:
        out[offset : offset + stop - start] = tensor[start:stop]
        offset += stop - start
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
