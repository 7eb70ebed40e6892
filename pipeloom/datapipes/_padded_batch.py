"""``padded_batch``: batches of variable-length sequences padded to their longest.

``pipe.padded_batch(n, ...)`` is ``pipe.batch(n).collate(PadCollate(...))``:
two ordinary blocks, so a reading service runs it wherever it runs ``batch``
and ``collate`` (under the classic strategy, inside the workers when the
blocks before it yield one output per item; under economic, in the batch
workers). ``PadCollate`` also pads batches made by other blocks, e.g.
``pipe.bucket_by_length(...).collate(PadCollate())``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch

from ._collate import default_collate
from ._sequences import (
    PadValue,
    check_pad_keys,
    check_pad_value,
    check_same_keys,
    entry_tensor,
    is_sequence,
    pad_for,
    padding,
    sequence_keys,
)

__all__ = ["PadCollate", "PaddedBatch"]


class PaddedBatch(NamedTuple):
    """A batch of sequences padded to a common length.

    Attributes:
        values: ``[batch, length, ...]``, padded at the end of each row.
        lengths: ``[batch]`` int64, each sequence's own length.
        mask: ``[batch, length]`` bool, True on real positions.
    """

    values: torch.Tensor
    lengths: torch.Tensor
    mask: torch.Tensor


class PadCollate:
    """A ``collate_fn`` that pads each batch to its longest sequence (tf.data's ``padded_batch``).

    * Sequences (tensors/arrays along the first dimension, lists of numbers)
      give a :class:`PaddedBatch` ``(values, lengths, mask)``.
    * Dicts give a dict: each sequence field padded to its own longest, other
      values collated as ``collate()`` does, plus ``lengths_key`` and
      ``mask_key`` from the field ``length_key`` (default ``"input_ids"`` if
      present, else the first sequence field). Set a key to None to leave it out
      (e.g. to call ``model(**batch)`` on a model that takes no lengths).

    Args:
        pad_value: the padding, or a dict of field -> padding (0 where unnamed).
        pad_to_multiple_of: round each padded length up to a multiple of this
            (e.g. 8 for tensor cores), or None.
        length_key: the field whose lengths give ``lengths`` and ``mask`` (dicts).
        mask_key: the output key of the mask (dicts), or None.
        lengths_key: the output key of the lengths (dicts), or None.

    Example:
        >>> batch = PadCollate(pad_value=-1)([[1, 2, 3], [4]])
        >>> batch.values.tolist(), batch.lengths.tolist()
        ([[1, 2, 3], [4, -1, -1]], [3, 1])
        >>> batch.mask.tolist()
        [[True, True, True], [True, False, False]]
    """

    def __init__(
        self,
        pad_value: PadValue = 0,
        pad_to_multiple_of: int | None = None,
        *,
        length_key: str | None = None,
        mask_key: str | None = "attention_mask",
        lengths_key: str | None = "lengths",
    ) -> None:
        check_pad_value("padded_batch", pad_value)
        bad_multiple = isinstance(pad_to_multiple_of, bool) or not isinstance(
            pad_to_multiple_of, int
        )
        if pad_to_multiple_of is not None and (bad_multiple or pad_to_multiple_of < 1):
            raise ValueError(
                f"pad_to_multiple_of must be None or an int >= 1, got {pad_to_multiple_of!r}"
            )
        for name, key in (
            ("length_key", length_key),
            ("mask_key", mask_key),
            ("lengths_key", lengths_key),
        ):
            if key is not None and not isinstance(key, str):
                raise TypeError(f"{name} must be a str or None, got {key!r}")
        self.pad_value = pad_value
        self.pad_to_multiple_of = pad_to_multiple_of
        self.length_key = length_key
        self.mask_key = mask_key
        self.lengths_key = lengths_key

    def __call__(self, batch: Sequence[Any]) -> Any:
        if not batch:
            raise ValueError("padded_batch() got an empty batch; there is nothing to pad")
        check_same_keys(batch, "padded_batch", "batch")
        check_pad_keys("padded_batch", self.pad_value, batch[0])
        if isinstance(batch[0], Mapping):
            return self._pad_dicts(batch)
        values, lengths = self._pad(list(batch), pad_for(self.pad_value, None), "sequence")
        return PaddedBatch(values, lengths, _mask(lengths, values.shape[1]))

    def _pad_dicts(self, batch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        fields = sequence_keys(batch[0])
        length_key = self.length_key or ("input_ids" if "input_ids" in fields else None)
        length_key = length_key or (fields[0] if fields else None)
        if length_key not in fields:
            raise ValueError(
                f"padded_batch() needs a sequence field to measure, got length_key="
                f"{self.length_key!r} but the sequence fields are {fields}"
            )
        out: dict[str, Any] = {}
        measured = torch.zeros(0, dtype=torch.int64), 0
        for key in batch[0]:
            column = [_field(item, key) for item in batch]
            if key in fields:
                padded, lengths = self._pad(column, pad_for(self.pad_value, key), repr(key))
                out[key] = padded
                if key == length_key:
                    measured = lengths, padded.shape[1]
            else:
                out[key] = default_collate(column)
        for name, made in (
            (self.lengths_key, measured[0]),
            (self.mask_key, _mask(*measured)),
        ):
            if name is None:
                continue
            if name in out:
                raise ValueError(
                    f"padded_batch() adds {name!r}, but the items already have that key; "
                    f"pass another name (mask_key=/lengths_key=) or None to leave it out"
                )
            out[name] = made
        return out

    def _pad(self, column: list[Any], pad: Any, what: str) -> tuple[torch.Tensor, torch.Tensor]:
        tensors = []
        for value in column:
            if not is_sequence(value):
                raise TypeError(
                    f"padded_batch() pads sequences (tensors, arrays, lists), but a {what} "
                    f"entry is {type(value).__name__} {value!r}"
                )
            tensors.append(entry_tensor(value, "padded_batch", what))
        trailing = {tuple(t.shape[1:]) for t in tensors}
        if len(trailing) > 1:
            raise ValueError(
                f"padded_batch() pads along the first dimension only, but the {what} entries "
                f"differ after it: shapes {[tuple(t.shape) for t in tensors]}"
            )
        lengths = torch.tensor([t.shape[0] for t in tensors], dtype=torch.int64)
        longest = int(lengths.max())
        multiple = self.pad_to_multiple_of
        if multiple is not None:
            longest = -(-longest // multiple) * multiple
        out = padding((len(tensors), longest, *tensors[0].shape[1:]), pad, tensors, what)
        for row, tensor in zip(out, tensors):
            row[: tensor.shape[0]] = tensor
        return out, lengths

    def __repr__(self) -> str:
        return (
            f"PadCollate(pad_value={self.pad_value!r}, "
            f"pad_to_multiple_of={self.pad_to_multiple_of!r})"
        )


def _field(item: Any, key: str) -> Any:
    if not isinstance(item, Mapping) or key not in item:
        raise ValueError(
            f"padded_batch() got a batch whose items differ: the first has key {key!r}, "
            f"another item {'lacks it' if isinstance(item, Mapping) else 'is not a dict'}"
        )
    return item[key]


def _mask(lengths: torch.Tensor, length: int) -> torch.Tensor:
    return torch.arange(length)[None, :] < lengths[:, None]
