"""The global RNGs user code draws from, and whether a piece of work drew from them.

``random``, NumPy's legacy global RNG and torch's CPU generator are shared by
everything in a process (and, in worker threads, by every thread). A copy of
the part of a pipeline before the sharding point, one per worker and rank,
must make the same items in every copy: a draw from these there makes each
copy draw its own numbers. :class:`GlobalDrawCheck` looks for such draws on a
few items per epoch (reading the states costs tens of microseconds).
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import torch

__all__ = ["GlobalDrawCheck", "global_rng_states", "same_rng_states"]

RngStates = tuple[Any, Any, torch.Tensor]


def global_rng_states() -> RngStates:
    """The states of ``random``, NumPy's legacy global RNG and torch's CPU generator."""
    return random.getstate(), np.random.get_state(), torch.default_generator.get_state()


def same_rng_states(a: RngStates, b: RngStates) -> bool:
    """True when no draw was taken from any global RNG between the two states.

    Example:
        >>> before = global_rng_states()
        >>> same_rng_states(before, global_rng_states())
        True
        >>> _ = random.random()
        >>> same_rng_states(before, global_rng_states())
        False
    """
    (python_a, numpy_a, torch_a), (python_b, numpy_b, torch_b) = a, b
    return (
        python_a == python_b
        and numpy_a[2:] == numpy_b[2:]
        and bool(np.array_equal(numpy_a[1], numpy_b[1]))
        and torch.equal(torch_a, torch_b)
    )


class GlobalDrawCheck:
    """Watches the first ``checks`` pieces of work of an epoch for global-RNG draws.

    ``start()`` before a piece of work, ``done()`` after it; the first draw
    seen warns once (``RuntimeWarning`` with ``message``) and ends the checks.

    Example:
        >>> check = GlobalDrawCheck(checks=2, message="drew")
        >>> check.start(); check.done()
        >>> check.left
        1
    """

    __slots__ = ("checks", "left", "message", "_before", "_warned")

    def __init__(self, *, checks: int, message: str) -> None:
        self.checks = checks
        self.message = message
        self.left = checks
        self._before: RngStates | None = None
        self._warned = False

    def restart(self) -> None:
        """A new epoch: check its first pieces of work again (after no warning)."""
        self.left = 0 if self._warned else self.checks

    def stop(self) -> None:
        self.left = 0

    def start(self) -> None:
        self._before = global_rng_states()

    def done(self) -> None:
        before, self._before = self._before, None
        if before is None:
            return
        self.left -= 1
        if not same_rng_states(before, global_rng_states()):
            self.left = 0
            self._warned = True
            warnings.warn(self.message, RuntimeWarning, stacklevel=3)
