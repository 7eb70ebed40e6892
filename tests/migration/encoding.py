"""Outputs as JSON that keeps their types: tuples, bytes, tensors, arrays, dicts with any keys.

Paths under the data folder are written relative to it (``<root>/...``), so a
recording made in one temporary folder compares with a run in another.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def encode(value: Any, root: str) -> Any:
    """``value`` as JSON-compatible data; raises TypeError for a type it cannot keep."""
    import numpy as np
    import torch

    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value.replace(root, "<root>")
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).decode("latin-1").replace(root, "<root>")}
    if isinstance(value, tuple):
        return {"tuple": [encode(v, root) for v in value]}
    if isinstance(value, list):
        return [encode(v, root) for v in value]
    if isinstance(value, dict):
        return {"dict": [[encode(k, root), encode(v, root)] for k, v in value.items()]}
    if isinstance(value, torch.Tensor):
        return {"tensor": [str(value.dtype), list(value.shape), value.flatten().tolist()]}
    if isinstance(value, np.ndarray):
        return {"ndarray": [str(value.dtype), list(value.shape), value.flatten().tolist()]}
    if isinstance(value, np.generic):
        return {"numpy": [str(value.dtype), value.item()]}
    if hasattr(value, "read"):
        return {"stream": encode(value.read(), root)}
    if isinstance(value, Sequence):  # e.g. protobuf's repeated fields, as torchdata gave them
        return [encode(v, root) for v in value]
    raise TypeError(f"cannot encode a {type(value).__name__}: {value!r:.80}")
