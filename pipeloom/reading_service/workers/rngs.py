"""The seeds of worker processes and threads, and of the global RNGs inside them.

Per-item randomness comes from ``item_rng()``; these are for code written
against torch's conventions, which draws from ``random``, NumPy's legacy
global RNG and torch's default generator.
"""

from __future__ import annotations

import ctypes
import random
from typing import Any

import numpy as np
import torch

from ...datapipes.runtime import derive_seed, global_rng_states, same_rng_states

__all__ = [
    "global_rng_states",
    "same_rng_states",
    "set_global_rng_states",
    "seed_item_rngs",
    "seed_numpy_global",
    "seed_worker_rngs",
    "worker_seed",
    "workers_seed",
]

_RANK_TAG = 0x4A2C
"""Mixed into a pool's seed with the rank's shard (``workers_seed``)."""


def workers_seed(part_seed: int | None, outer: tuple[int, int]) -> int:
    """The seed a pool's worker seeds derive from.

    The workers' part's seed (None: no pipeline seed, 0) and, when ranks share
    the pipeline (``outer``: this rank keeps shard ``index`` of ``total``), the
    rank's shard: every rank agrees on one pipeline seed, and without it worker
    ``i`` of every rank would draw the same global-RNG numbers (the same
    augmentations on every rank).

    Example:
        >>> workers_seed(5, (1, 0))
        5
        >>> workers_seed(5, (2, 0)) != workers_seed(5, (2, 1))
        True
    """
    seed = part_seed or 0
    total, index = outer
    return seed if total == 1 else derive_seed(seed, total, index, _RANK_TAG)


def worker_seed(seed: int, epoch: int, worker_id: int) -> int:
    """The seed of worker ``worker_id`` in ``epoch``: distinct per worker and epoch.

    Example:
        >>> worker_seed(0, 0, 0) != worker_seed(0, 0, 1) != worker_seed(0, 1, 0)
        True
    """
    return derive_seed(seed, epoch, worker_id, 0x3EED)


def seed_worker_rngs(seed: int) -> None:
    """Seed ``random``, NumPy's legacy global RNG and torch in this worker."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def seed_item_rngs(seed: int) -> None:
    """Seed ``random``, NumPy's legacy global RNG and torch's CPU generator for one item.

    Economic and chunked workers call it before each item, so code that draws
    from the global RNGs (e.g. random transforms) gets the same draws whichever
    worker the item lands on. All three use the whole (63-bit) seed (NumPy: see
    :func:`seed_numpy_global`). About 5 µs (``torch.manual_seed`` would take 100+).
    """
    random.seed(seed)
    seed_numpy_global(seed)
    torch.default_generator.manual_seed(seed)


_MASK32 = 0xFFFFFFFF
_HIGH_WORDS = (
    np.random.Generator(np.random.PCG64(0x5EED_B175)).integers(0, 1 << 32, 624, dtype=np.uint64) | 1
).astype(np.uint32)
"""Odd constants: the upper 32 bits of a seed, times word ``i``'s, is XORed into key word ``i``."""


class _NumpyKey:
    """A writable view of the 624 key words of NumPy's legacy global MT19937 (or None)."""

    view: np.ndarray | None = None
    checked = False
    scratch = np.empty(624, np.uint32)


def _numpy_key() -> np.ndarray | None:
    """The key view, made and checked against ``get_state()`` once per process."""
    if not _NumpyKey.checked:
        _NumpyKey.checked = True
        try:
            generator = np.random.mtrand._rand._bit_generator
            words = (ctypes.c_uint32 * 624).from_address(generator.ctypes.state_address)
            view = np.ctypeslib.as_array(words)
            np.random.seed(12345)
            state: Any = np.random.get_state()
            if np.array_equal(view, state[1]):
                _NumpyKey.view = view
        except (AttributeError, TypeError, ValueError):  # another NumPy layout: slow path
            _NumpyKey.view = None
    return _NumpyKey.view


def seed_numpy_global(seed: int) -> None:
    """Seed NumPy's legacy global RNG from all 64 bits of ``seed`` (not ``seed % 2**32``).

    ``np.random.seed(seed % 2**32)`` can reach only 2**32 states: over an
    ImageNet epoch (1.28 M items) about 190 pairs of items would draw the same
    NumPy numbers. The key is seeded from the lower 32 bits as NumPy does, then
    every word is XORed with the upper 32 bits times an odd constant of its
    own, so seeds that differ only in their upper bits start from keys that
    differ in every word. About 1.5 µs more than the 32-bit seeding (NumPy's
    own seeding from two words costs 7 µs more); where NumPy's state cannot be
    written in place, it seeds from the two words.

    Example:
        >>> seed_numpy_global(5); a = np.random.random()
        >>> seed_numpy_global(5 + (1 << 32)); b = np.random.random()
        >>> seed_numpy_global(5); a == np.random.random() != b
        True
    """
    low, high = seed & _MASK32, (seed >> 32) & _MASK32
    key = _NumpyKey.view if _NumpyKey.checked else _numpy_key()
    if key is None or not high:
        np.random.seed([low, high] if high else low)
        return
    np.random.seed(low)
    scratch = _NumpyKey.scratch
    np.multiply(_HIGH_WORDS, high, out=scratch, casting="unsafe")
    np.bitwise_xor(key, scratch, out=key)


def set_global_rng_states(states: tuple[Any, Any, torch.Tensor]) -> None:
    """Put the global RNGs back as :func:`global_rng_states` saw them."""
    python, numpy, generator = states
    random.setstate(python)
    np.random.set_state(numpy)
    torch.default_generator.set_state(generator)
