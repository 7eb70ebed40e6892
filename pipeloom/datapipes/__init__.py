"""Blocks and the asynchronous protocol they share.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> list(IterableWrapper(range(6)).map(lambda x: x * 2).batch(4))
    [[0, 2, 4, 6], [8, 10]]
"""

from ..errors import NotAvailable
from ._base import BlockingReader, DataPipe, IterDataPipe, MapDataPipe
from ._context import current_position, derive_seed, item_rng, item_seed
from ._functional import functional_datapipe
from ._pipeline import (
    check_declared_inputs,
    load_pipeline_state_dict,
    pipeline_state_dict,
    reset_pipeline,
    seed_pipeline,
    set_pipeline_epoch,
    traverse_roots,
    upstream_blocks,
)
from ._wrappers import IterableWrapper, MapToIter, SequenceWrapper, as_datapipe

__all__ = [
    "BlockingReader",
    "DataPipe",
    "IterDataPipe",
    "IterableWrapper",
    "MapDataPipe",
    "MapToIter",
    "NotAvailable",
    "SequenceWrapper",
    "as_datapipe",
    "check_declared_inputs",
    "current_position",
    "derive_seed",
    "functional_datapipe",
    "item_rng",
    "item_seed",
    "load_pipeline_state_dict",
    "pipeline_state_dict",
    "reset_pipeline",
    "seed_pipeline",
    "set_pipeline_epoch",
    "traverse_roots",
    "upstream_blocks",
]
