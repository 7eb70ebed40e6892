"""Blocks and the asynchronous protocol they share.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> list(IterableWrapper(range(6)).map(lambda x: x * 2).batch(4))
    [[0, 2, 4, 6], [8, 10]]
"""

from ..errors import NotAvailable
from . import iter as iter  # torchdata's class names: dp.iter.FileLister(...)
from . import map as map  # and dp.map.SequenceWrapper(...)
from ._add_index import IndexAdder
from ._async_map_batches import AsyncBatchMapper
from ._base import BlockingReader, DataPipe, IterDataPipe, MapDataPipe
from ._columns import Dropper, Flattener, Slicer
from ._compact import CompactStringList
from ._context import current_position, derive_seed, item_rng, item_seed
from ._decode import Decoder, default_decoders
from ._decompress import Bz2FileLoader, CompressionType, Decompressor, XzFileLoader
from ._device import PinMemory, ToDevice
from ._files import FileLister, FileOpener, StreamOpener, StreamReader
from ._fingerprint import Fingerprint, UnfingerprintableError, fingerprint
from ._fsspec import FSSpecFileLister, FSSpecFileOpener
from ._fullsync import FullSync, RankStopped
from ._functional import functional_datapipe
from ._groupby import Grouper
from ._hash import HashChecker
from ._http import HttpReader
from ._in_memory_cache import InMemoryCacheHolder
from ._json import JsonParser
from ._key_zip import IterKeyZipper, MapKeyZipper
from ._list_files import FSSpecRootLister, RootLister
from ._map_batches import BatchMapper
from ._map_cache import MapInMemoryCacheHolder
from ._on_disk_cache import EndOnDiskCacheHolder, OnDiskCacheHolder
from ._padded_batch import PadCollate, PaddedBatch
from ._paragraphs import ParagraphAggregator
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
from ._random_split import SplitPart, random_split
from ._read_stream import StreamChunkReader
from ._repeat import Repeater
from ._round_robin import round_robin_demux
from ._routed_decode import RoutedDecoder
from ._rows2columnar import Rows2Columnar
from ._save import FSSpecSaver, Saver
from ._set_length import LengthSetter
from ._shard_expand import ShardExpander
from ._shuffled_flatmap import ShuffledFlatMapper
from ._snapshot import Snapshot
from ._state_fields import StateFields
from ._tar import TarArchiveLoader, TarMemberPath
from ._text import CSVParser, LineReader
from ._tfrecord import TFRecordLoader
from ._threadpool_map import ThreadPoolMapper
from ._to_map import IterToMapConverter
from ._unzip import unzip, unzip_map
from ._webdataset import WebDataset
from ._wrappers import IterableWrapper, MapToIter, SequenceWrapper, as_datapipe
from ._zip_archive import ZipArchiveLoader
from ._zip_longest import ZipperLongest

__all__ = [
    "as_datapipe",
    "AsyncBatchMapper",
    "BatchMapper",
    "BlockingReader",
    "Bz2FileLoader",
    "check_declared_inputs",
    "CompactStringList",
    "CompressionType",
    "CSVParser",
    "current_position",
    "DataPipe",
    "Decoder",
    "Decompressor",
    "default_decoders",
    "derive_seed",
    "Dropper",
    "FileLister",
    "FileOpener",
    "Flattener",
    "EndOnDiskCacheHolder",
    "fingerprint",
    "Fingerprint",
    "FSSpecFileLister",
    "FSSpecFileOpener",
    "FSSpecRootLister",
    "FSSpecSaver",
    "FullSync",
    "functional_datapipe",
    "Grouper",
    "HashChecker",
    "HttpReader",
    "IndexAdder",
    "InMemoryCacheHolder",
    "item_rng",
    "item_seed",
    "IterableWrapper",
    "IterDataPipe",
    "IterKeyZipper",
    "IterToMapConverter",
    "JsonParser",
    "LengthSetter",
    "LineReader",
    "load_pipeline_state_dict",
    "MapDataPipe",
    "MapInMemoryCacheHolder",
    "MapKeyZipper",
    "MapToIter",
    "NotAvailable",
    "PadCollate",
    "PaddedBatch",
    "ParagraphAggregator",
    "OnDiskCacheHolder",
    "PinMemory",
    "pipeline_state_dict",
    "random_split",
    "RankStopped",
    "Repeater",
    "reset_pipeline",
    "RootLister",
    "round_robin_demux",
    "RoutedDecoder",
    "Rows2Columnar",
    "Saver",
    "seed_pipeline",
    "SequenceWrapper",
    "set_pipeline_epoch",
    "ShardExpander",
    "ShuffledFlatMapper",
    "Slicer",
    "SplitPart",
    "StreamChunkReader",
    "Snapshot",
    "StateFields",
    "StreamOpener",
    "StreamReader",
    "TarArchiveLoader",
    "TarMemberPath",
    "TFRecordLoader",
    "ThreadPoolMapper",
    "ToDevice",
    "UnfingerprintableError",
    "traverse_roots",
    "unzip",
    "unzip_map",
    "upstream_blocks",
    "WebDataset",
    "XzFileLoader",
    "ZipArchiveLoader",
    "ZipperLongest",
]
