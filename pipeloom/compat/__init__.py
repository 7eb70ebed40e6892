"""A drop-in ``torch.utils.data.DataLoader`` on pipeloom's engine.

Change one import::

    from pipeloom.compat import DataLoader

and the loader takes torch's arguments and yields torch's batches (same
indices, order and values for the same seeds), loading them with pipeloom's
reading services. See ``docs/compat.md``.

Example:
    >>> from pipeloom.compat import DataLoader
    >>> [b.tolist() for b in DataLoader(list(range(5)), batch_size=2)]
    [[0, 1], [2, 3], [4]]
"""

from ._args import STRATEGIES
from ._loader import ITERABLE_STRATEGY, MAP_STYLE_STRATEGY, DataLoader, build_map_pipeline

__all__ = [
    "DataLoader",
    "ITERABLE_STRATEGY",
    "MAP_STYLE_STRATEGY",
    "STRATEGIES",
    "build_map_pipeline",
]
