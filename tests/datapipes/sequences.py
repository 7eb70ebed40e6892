"""Helpers for the tests of the sequence blocks (pack, concat_then_split, padding)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def plain(value: Any) -> Any:
    """Tensors and arrays as nested lists, so outputs compare with ``==``."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.tolist()
    if isinstance(value, dict):
        return {key: plain(v) for key, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(plain(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def numbered_sequences(lengths: list[int], start: int = 1) -> list[list[int]]:
    """Sequences of the given lengths whose tokens are distinct, increasing ints."""
    out, token = [], start
    for length in lengths:
        out.append(list(range(token, token + length)))
        token += length
    return out


def segments_of(values: list, segment_ids: list[int]) -> list[list]:
    """The tokens of each segment of one row, in order (padding left out)."""
    found: dict[int, list] = {}
    for value, segment in zip(values, segment_ids):
        if segment:
            found.setdefault(segment, []).append(value)
    return [found[k] for k in sorted(found)]
