"""A block runs in one ``DataLoader``: the newest loader built over it takes it.

Two loaders over the same blocks (a validation loader sharing the training
pipeline's prefix, a second loader over the same ``pipe``) would seed,
restart and read those blocks for both: each would silently get the other's
seed, lose items to the other's epochs, or yield its half-read buffers. So
building a loader takes its blocks from any earlier loader still holding
them, and that loader refuses to run again, saying why. Building loader
after loader over one pipeline, using only the newest, keeps working.

Example:
    >>> class Loader:
    ...     lost = None
    ...     def _blocks_taken(self, by, block):
    ...         self.lost = block
    >>> first, second, block = Loader(), Loader(), object.__new__(type("Block", (), {}))
    >>> claim(first, [block]); claim(second, [block])
    >>> first.lost is block and second.lost is None
    True
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Iterable
from typing import Any

__all__ = ["claim"]

_OWNERS: dict[int, tuple[weakref.ref[Any], weakref.ref[Any]]] = {}
"""id(block) -> (the block, the loader it runs in), both weakly held."""
_GUARD = threading.RLock()  # a collection inside the claim may run _forget


def claim(loader: Any, blocks: Iterable[Any]) -> None:
    """Make ``loader`` the one that runs ``blocks``.

    Each live earlier owner of one of them is told once, through
    ``owner._blocks_taken(loader, block)``, after the claim.
    """
    me = weakref.ref(loader)
    losers: dict[int, tuple[Any, Any]] = {}
    with _GUARD:
        for block in blocks:
            key = id(block)
            held = _OWNERS.get(key)
            if held is not None and held[0]() is block:
                owner = held[1]()
                if owner is not None and owner is not loader:
                    losers.setdefault(id(owner), (owner, block))
            try:
                ref = weakref.ref(block, functools.partial(_forget, key))
            except TypeError:  # a block without weak references cannot be tracked
                continue
            _OWNERS[key] = (ref, me)
    for owner, block in losers.values():
        owner._blocks_taken(loader, block)  # noqa: SLF001 - the loader's side of this


def _forget(key: int, _: Any = None) -> None:
    with _GUARD:
        held = _OWNERS.get(key)
        if held is not None and held[0]() is None:
            del _OWNERS[key]
