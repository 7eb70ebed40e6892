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
from . import iter as iter  # torchdata's class names: dp.iter.FileLister(...)
from . import map as map  # and dp.map.SequenceWrapper(...)
from ._add_index import IndexAdder
from ._async_map_batches import AsyncBatchMapper
from ._base import DataPipe, IterDataPipe, MapDataPipe
from ._batch import Batcher, MapBatcher, Unbatcher
from ._bucketbatch import BucketBatcher
from ._collate import Collator, default_collate
from ._columns import Dropper, Flattener, Slicer
from ._compact import CompactStringList
from ._concat import Concater, MapConcater
from ._context import (
    current_key,
    current_position,
    empty_output,
    item_rng,
    item_seed,
    item_stamp,
    set_item_stamp,
)
from ._cycle import Cycler
from ._decode import Decoder, default_decoders
from ._decompress import Bz2FileLoader, CompressionType, Decompressor, XzFileLoader
from ._demux import Demultiplexer
from ._device import PinMemory, ToDevice
from ._enumerate import Enumerator
from ._files import FileOpener, StreamOpener, StreamReader
from ._filter import Filter
from ._fingerprint import Fingerprint, UnfingerprintableError, fingerprint
from ._flatmap import FlatMapper
from ._fork import Forker
from ._fsspec import FSSpecFileLister, FSSpecFileOpener
from ._fullsync import FullSync, RankStopped
from ._functional import functional_datapipe
from ._groupby import Grouper
from ._hash import HashChecker
from ._header import Header
from ._http import HttpReader
from ._in_batch_shuffle import InBatchShuffler
from ._in_memory_cache import InMemoryCacheHolder
from ._json import JsonParser
from ._key_zip import IterKeyZipper, MapKeyZipper
from ._list_files import FSSpecRootLister, RootLister
from ._listers import FileLister
from ._map import MapMapper, Mapper
from ._map_batches import BatchMapper
from ._map_cache import MapInMemoryCacheHolder
from ._mux import Multiplexer
from ._on_disk_cache import EndOnDiskCacheHolder, OnDiskCacheHolder
from ._padded_batch import PadCollate, PaddedBatch
from ._paragraphs import ParagraphAggregator
from ._pipeline import (
    load_pipeline_state_dict,
    pipeline_state_dict,
    reset_pipeline,
    seed_pipeline,
    set_pipeline_epoch,
)
from ._prefetch import Prefetcher
from ._random_split import SplitPart, random_split
from ._read_stream import StreamChunkReader
from ._reader import BlockingReader
from ._repeat import Repeater
from ._round_robin import round_robin_demux
from ._routed_decode import RoutedDecoder
from ._rows2columnar import Rows2Columnar
from ._save import FSSpecSaver, Saver
from ._set_length import LengthSetter
from ._shard_expand import ShardExpander
from ._sharding import ShardingFilter
from ._shuffle import MapShuffler, Shuffler
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
from ._zip import MapZipper, Zipper
from ._zip_archive import ZipArchiveLoader
from ._zip_longest import ZipperLongest

__all__ = [
    "as_datapipe",
    "AsyncBatchMapper",
    "Batcher",
    "BatchMapper",
    "BlockingReader",
    "BucketBatcher",
    "Bz2FileLoader",
    "Collator",
    "CompactStringList",
    "CompressionType",
    "Concater",
    "CSVParser",
    "current_key",
    "current_position",
    "Cycler",
    "DataPipe",
    "Decoder",
    "Decompressor",
    "default_collate",
    "default_decoders",
    "Demultiplexer",
    "Dropper",
    "EndOnDiskCacheHolder",
    "Enumerator",
    "FileLister",
    "FileOpener",
    "Filter",
    "fingerprint",
    "Fingerprint",
    "FlatMapper",
    "Flattener",
    "Forker",
    "FSSpecFileLister",
    "FSSpecFileOpener",
    "FSSpecRootLister",
    "FSSpecSaver",
    "FullSync",
    "functional_datapipe",
    "Grouper",
    "HashChecker",
    "Header",
    "HttpReader",
    "InBatchShuffler",
    "IndexAdder",
    "InMemoryCacheHolder",
    "empty_output",
    "item_rng",
    "item_seed",
    "item_stamp",
    "IterableWrapper",
    "IterDataPipe",
    "IterKeyZipper",
    "IterToMapConverter",
    "JsonParser",
    "LengthSetter",
    "LineReader",
    "load_pipeline_state_dict",
    "MapBatcher",
    "MapConcater",
    "MapDataPipe",
    "MapInMemoryCacheHolder",
    "MapKeyZipper",
    "MapMapper",
    "Mapper",
    "MapShuffler",
    "MapToIter",
    "MapZipper",
    "Multiplexer",
    "NotAvailable",
    "OnDiskCacheHolder",
    "PadCollate",
    "PaddedBatch",
    "ParagraphAggregator",
    "PinMemory",
    "pipeline_state_dict",
    "Prefetcher",
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
    "ShardingFilter",
    "ShuffledFlatMapper",
    "Shuffler",
    "Slicer",
    "Snapshot",
    "SplitPart",
    "StreamChunkReader",
    "StateFields",
    "StreamOpener",
    "StreamReader",
    "TarArchiveLoader",
    "TarMemberPath",
    "TFRecordLoader",
    "ThreadPoolMapper",
    "ToDevice",
    "Unbatcher",
    "UnfingerprintableError",
    "unzip",
    "unzip_map",
    "WebDataset",
    "XzFileLoader",
    "ZipArchiveLoader",
    "Zipper",
    "ZipperLongest",
    "set_item_stamp",
]
