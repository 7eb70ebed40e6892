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
]


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
