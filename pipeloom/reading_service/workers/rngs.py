"""The seeds of worker processes and threads, and of the global RNGs inside them.

Per-item randomness comes from ``item_rng()``; these are for code written
against torch's conventions, which draws from ``random``, NumPy's legacy
global RNG and torch's default generator.
"""

from __future__ import annotations

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
    worker the item lands on. About 8 µs (``torch.manual_seed`` would take 100+).
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.default_generator.manual_seed(seed)


def set_global_rng_states(states: tuple[Any, Any, torch.Tensor]) -> None:
    """Put the global RNGs back as :func:`global_rng_states` saw them."""
    python, numpy, generator = states
    random.setstate(python)
    np.random.set_state(numpy)
    torch.default_generator.set_state(generator)
