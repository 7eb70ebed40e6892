"""Swap one upstream block for another in a block's input attributes (``pipeloom.graph``).

An input attribute holds a block, or a list, tuple or dict of blocks; the
swap keeps the container's type.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> a, b = IterableWrapper([1]), IterableWrapper([2])
    >>> pipe = a.zip(a)
    >>> replace_input(pipe, a, b)
    >>> [list(p) for p in pipe.parents]
    [[2], [2]]
"""

from __future__ import annotations

from typing import Any

__all__ = ["replace_input"]


def replace_input(block: Any, old: Any, new: Any) -> None:
    """Make every input of ``block`` that holds ``old`` hold ``new`` instead."""
    replaced = False
    for name in block.input_names():
        value = getattr(block, name)
        if value is old:
            setattr(block, name, new)
            replaced = True
        elif isinstance(value, dict) and any(v is old for v in value.values()):
            setattr(block, name, type(value)({k: new if v is old else v for k, v in value.items()}))
            replaced = True
        elif isinstance(value, (list, tuple)) and any(v is old for v in value):
            swapped = [new if v is old else v for v in value]
            setattr(block, name, type(value)(swapped) if isinstance(value, tuple) else swapped)
            replaced = True
    if not replaced:
        raise ValueError(f"{block!r} has no input {old!r}; its inputs are {block.parents!r}")
