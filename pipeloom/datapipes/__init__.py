"""Blocks and the asynchronous protocol they share.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> list(IterableWrapper(range(6)).map(lambda x: x * 2).batch(4))
    [[0, 2, 4, 6], [8, 10]]
"""

from ..errors import NotAvailable
from ._base import BlockingReader, DataPipe, IterDataPipe, MapDataPipe
from ._compact import CompactStringList
from ._context import current_position, derive_seed, item_rng, item_seed
from ._decode import Decoder, default_decoders
from ._device import PinMemory, ToDevice
from ._files import FileLister, FileOpener, StreamOpener, StreamReader
from ._fsspec import FSSpecFileLister, FSSpecFileOpener
from ._functional import functional_datapipe
from ._http import HttpReader
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
from ._state_fields import StateFields
from ._tar import TarArchiveLoader, TarMemberPath
from ._text import CSVParser, LineReader
from ._webdataset import WebDataset
from ._wrappers import IterableWrapper, MapToIter, SequenceWrapper, as_datapipe

__all__ = [
    "as_datapipe",
    "BlockingReader",
    "check_declared_inputs",
    "CompactStringList",
    "CSVParser",
    "current_position",
    "DataPipe",
    "Decoder",
    "default_decoders",
    "derive_seed",
    "FileLister",
    "FileOpener",
    "FSSpecFileLister",
    "FSSpecFileOpener",
    "functional_datapipe",
    "HttpReader",
    "item_rng",
    "item_seed",
    "IterableWrapper",
    "IterDataPipe",
    "LineReader",
    "load_pipeline_state_dict",
    "MapDataPipe",
    "MapToIter",
    "NotAvailable",
    "pipeline_state_dict",
    "PinMemory",
    "reset_pipeline",
    "seed_pipeline",
    "SequenceWrapper",
    "set_pipeline_epoch",
    "StateFields",
    "StreamOpener",
    "StreamReader",
    "TarArchiveLoader",
    "TarMemberPath",
    "ToDevice",
    "traverse_roots",
    "upstream_blocks",
    "WebDataset",
]
