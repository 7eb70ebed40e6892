"""Blocks and the asynchronous protocol they share.

Every block class is importable from here (``Mapper``, ``Batcher``, ...); the
chaining methods (``.map()``, ``.batch()``, ...) build the same objects.
``pipeloom.datapipes.runtime`` holds what code that *runs* pipelines needs
(item stamps, per-block framework state); building a pipeline never needs it.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> list(IterableWrapper(range(6)).map(lambda x: x * 2).batch(4))
    [[0, 2, 4, 6], [8, 10]]
"""

from ..errors import NotAvailable
from ._base import DataPipe, IterDataPipe, MapDataPipe
from ._batch import Batcher, MapBatcher, Unbatcher
from ._bucketbatch import BucketBatcher
from ._collate import Collator, default_collate
from ._compact import CompactStringList
from ._concat import Concater, MapConcater
from ._context import current_position, item_rng, item_seed
from ._cycle import Cycler
from ._decode import Decoder, default_decoders
from ._demux import Demultiplexer
from ._device import PinMemory, ToDevice
from ._enumerate import Enumerator
from ._files import FileLister, FileOpener, StreamOpener, StreamReader
from ._filter import Filter
from ._flatmap import FlatMapper
from ._fork import Forker
from ._fsspec import FSSpecFileLister, FSSpecFileOpener
from ._functional import functional_datapipe
from ._header import Header
from ._http import HttpReader
from ._in_batch_shuffle import InBatchShuffler
from ._map import MapMapper, Mapper
from ._mux import Multiplexer
from ._pipeline import (
    load_pipeline_state_dict,
    pipeline_state_dict,
    reset_pipeline,
    seed_pipeline,
    set_pipeline_epoch,
)
from ._prefetch import Prefetcher
from ._reader import BlockingReader
from ._sharding import ShardingFilter
from ._shuffle import MapShuffler, Shuffler
from ._tar import TarArchiveLoader, TarMemberPath
from ._text import CSVParser, LineReader
from ._webdataset import WebDataset
from ._wrappers import IterableWrapper, MapToIter, SequenceWrapper, as_datapipe
from ._zip import MapZipper, Zipper

__all__ = [
    "as_datapipe",
    "Batcher",
    "BlockingReader",
    "BucketBatcher",
    "Collator",
    "CompactStringList",
    "Concater",
    "CSVParser",
    "current_position",
    "Cycler",
    "DataPipe",
    "Decoder",
    "default_collate",
    "default_decoders",
    "Demultiplexer",
    "Enumerator",
    "FileLister",
    "FileOpener",
    "Filter",
    "FlatMapper",
    "Forker",
    "FSSpecFileLister",
    "FSSpecFileOpener",
    "functional_datapipe",
    "Header",
    "HttpReader",
    "InBatchShuffler",
    "item_rng",
    "item_seed",
    "IterableWrapper",
    "IterDataPipe",
    "LineReader",
    "load_pipeline_state_dict",
    "MapBatcher",
    "MapConcater",
    "MapDataPipe",
    "MapMapper",
    "Mapper",
    "MapShuffler",
    "MapToIter",
    "MapZipper",
    "Multiplexer",
    "NotAvailable",
    "PinMemory",
    "pipeline_state_dict",
    "Prefetcher",
    "reset_pipeline",
    "seed_pipeline",
    "SequenceWrapper",
    "set_pipeline_epoch",
    "ShardingFilter",
    "Shuffler",
    "StreamOpener",
    "StreamReader",
    "TarArchiveLoader",
    "TarMemberPath",
    "ToDevice",
    "Unbatcher",
    "WebDataset",
    "Zipper",
]
