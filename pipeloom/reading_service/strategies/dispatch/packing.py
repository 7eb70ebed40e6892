"""A task's outputs as one message: small tensors of one shape cross as one tensor.

An item worker sends each task's outputs (``(key, draws, item)`` tuples) in
one message. Pickling a tensor costs about as much as making a small one, so
when every item is a plain CPU tensor of the same shape and dtype the worker
stacks them and sends :class:`PackedOutputs`; the receiver takes the items
back as views of the one tensor (equal values, no copy). Anything else
crosses as the list it is.

Example:
    >>> import torch
    >>> outputs = [(0, 0, torch.ones(2)), (1, 0, torch.zeros(2))]
    >>> packed = pack(outputs)
    >>> type(packed).__name__
    'PackedOutputs'
    >>> [(k, d, t.tolist()) for k, d, t in unpack(packed)]
    [(0, 0, [1.0, 1.0]), (1, 0, [0.0, 0.0])]
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ....queues import DataLoaderQueue
from ...workers.messages import Output

__all__ = ["PackedOutputs", "pack", "unpack"]

_Tensor = torch.Tensor


class PackedOutputs(NamedTuple):
    """Outputs whose items are the rows of ``items`` (stacked on a new first dimension)."""

    keys: list[Any]
    draws: list[int]
    items: torch.Tensor


def pack(outputs: Any, into: DataLoaderQueue | None = None) -> Any:
    """``outputs`` as :class:`PackedOutputs` when its items stack exactly, else unchanged.

    ``into``: the queue the result will be put in; the stack is made in its
    memory (``empty_tensor``), so putting it copies nothing.
    """
    if not isinstance(outputs, list) or len(outputs) < 2:
        return outputs
    first = outputs[0][2]
    if type(first) is not _Tensor:
        return outputs
    shape, dtype = first.shape, first.dtype
    items = []
    for _, _, item in outputs:
        if type(item) is not _Tensor or item.shape != shape or item.dtype != dtype:
            return outputs
        items.append(item)
    if not _plain(first):
        return outputs
    out = None if into is None else into.empty_tensor((len(items), *shape), dtype)
    try:
        stacked = torch.stack(items, out=out)
    except RuntimeError:  # devices or layouts differ: they cross one by one
        return outputs
    if not _plain(stacked):  # one required grad, or was not a plain CPU tensor
        return outputs
    return PackedOutputs(
        [key for key, _, _ in outputs], [draws for _, draws, _ in outputs], stacked
    )


def _plain(tensor: torch.Tensor) -> bool:
    """A tensor whose rows unstack to independent values equal to what was stacked."""
    return (
        tensor.layout == torch.strided
        and tensor.device.type == "cpu"
        and not tensor.requires_grad
        and not tensor.is_quantized
    )


def unpack(outputs: Any) -> list[Output] | Any:
    """The list of outputs :func:`pack` was given (anything else is returned as is)."""
    if type(outputs) is not PackedOutputs:
        return outputs
    return list(zip(outputs.keys, outputs.draws, outputs.items.unbind(0)))
