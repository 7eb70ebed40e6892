"""Carry a persistent worker's global RNG streams across epochs, as torch's workers do.

pipeloom's reading service reseeds each worker's global RNGs at every epoch
(from seed, epoch and worker id). torch seeds a persistent worker once, and
its ``random``/NumPy/torch streams run on from epoch to epoch. A compat
source saves the streams when its epoch ends and puts them back when the
next epoch starts, so user code that draws from the global RNGs in a worker
sees torch's numbers.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
import torch.utils.data._utils.worker as torch_worker

__all__ = ["WorkerStreams"]


class WorkerStreams:
    """The global RNG states of a compat worker process at the end of an epoch.

    Example:
        >>> streams = WorkerStreams()
        >>> streams.save()  # outside a worker process: nothing to carry
        >>> streams.saved
        False
    """

    def __init__(self) -> None:
        self._state: tuple[Any, Any, torch.Tensor] | None = None

    @property
    def saved(self) -> bool:
        return self._state is not None

    def save(self) -> None:
        """Remember the streams (only in a compat worker process)."""
        if torch_worker._worker_info is not None:
            self._state = (random.getstate(), np.random.get_state(), torch.get_rng_state())

    def restore(self) -> None:
        """Continue the streams saved at the end of the previous epoch, if any."""
        if self._state is not None and torch_worker._worker_info is not None:
            python_state, numpy_state, torch_state = self._state
            random.setstate(python_state)
            np.random.set_state(numpy_state)
            torch.set_rng_state(torch_state)

    def __getstate__(self) -> dict[str, Any]:
        return {"_state": None}
