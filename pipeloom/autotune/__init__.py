"""Autotune: a reading service that picks and adjusts its own placement, output unchanged.

``DataLoader(pipe, reading_service="auto")`` runs the pipeline under an
:class:`AutoReadingService`: it measures the outputs the consumer receives,
tries worker threads and processes, more workers and deeper prefetch, and
the economic and chunked strategies and chunk sizes, within a :class:`Budget`
(CPU, memory, shared memory; defaults from the machine). It re-places the
epoch between two outputs by resuming the running service's checkpoint under
the new configuration (strategy moves: from the next epoch). Because pipeloom's order does not
depend on placement, the output is the untuned run's. See
``docs/performance.md``, "Autotune".

Example:
    >>> import pipeloom
    >>> from pipeloom.datapipes import IterableWrapper
    >>> pipe = IterableWrapper(range(12)).sharding_filter().map(lambda x: x + 1).batch(3)
    >>> with pipeloom.DataLoader(pipe, "auto", seed=0) as loader:
    ...     tuned = list(loader)
    >>> tuned == list(pipeloom.DataLoader(pipe, seed=0))
    True
"""

from ._config import Budget, Config
from ._service import AutoReadingService, as_reading_service, tuned_in
from ._tuner import HillClimb, Trial, Tuner

__all__ = [
    "AutoReadingService",
    "Budget",
    "Config",
    "HillClimb",
    "Trial",
    "Tuner",
    "as_reading_service",
    "tuned_in",
]
