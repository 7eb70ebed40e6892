"""torchdata 0.9's iterable class names, for ``import torchdata.datapipes as dp`` code.

``from torchdata.datapipes.iter import FileLister, HttpReader`` and
``dp.iter.FileOpener(...)`` keep working after changing ``torchdata`` to
``pipeloom`` in the import: each name here is pipeloom's block (or a small
function building it) taking torchdata's arguments. New code can use the
functional forms (``dp.open_files()``) and ``pipeloom.datapipes`` directly.
Names of torchdata blocks that pipeloom leaves out are listed in
docs/migrating_from_torchdata.md.

Example:
    >>> import pipeloom.datapipes as dp
    >>> list(dp.iter.Mapper(dp.iter.IterableWrapper([1, 2]), lambda x: x * 10))
    [10, 20]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ._async_map_batches import async_map_batches as BatchAsyncMapper
from ._base import IterDataPipe
from ._batch import Batcher, Unbatcher
from ._bucketbatch import BucketBatcher
from ._collate import Collator
from ._columns import Dropper, Flattener, Slicer
from ._concat import Concater
from ._cycle import Cycler
from ._decompress import Bz2FileLoader, Decompressor, XzFileLoader
from ._demux import demux
from ._device import PinMemory
from ._enumerate import Enumerator
from ._filter import Filter
from ._flatmap import FlatMapper
from ._fork import fork
from ._fsspec import FSSpecFileLister as _FSSpecPathLister
from ._fsspec import FSSpecFileOpener
from ._fullsync import FullSync
from ._groupby import Grouper
from ._hash import HashChecker
from ._header import Header
from ._json import JsonParser
from ._key_zip import IterKeyZipper, MapKeyZipper
from ._list_files import FSSpecRootLister, RootLister
from ._listers import FileLister as _PathLister
from ._map import Mapper
from ._map_batches import BatchMapper
from ._mux import Multiplexer
from ._paragraphs import ParagraphAggregator
from ._prefetch import Prefetcher
from ._random_split import random_split
from ._read_stream import StreamChunkReader
from ._repeat import Repeater
from ._round_robin import round_robin_demux
from ._routed_decode import RoutedDecoder
from ._rows2columnar import Rows2Columnar
from ._save import FSSpecSaver, Saver
from ._set_length import LengthSetter
from ._shard_expand import ShardExpander
from ._sharding import ShardingFilter
from ._shuffled_flatmap import ShuffledFlatMapper
from ._tar import TarArchiveLoader
from ._text import CSVParser, LineReader
from ._tfrecord import TFRecordLoader
from ._threadpool_map import ThreadPoolMapper
from ._unzip import unzip
from ._webdataset import WebDataset
from ._wrappers import IterableWrapper
from ._zip import Zipper
from ._zip_archive import ZipArchiveLoader
from ._zip_longest import ZipperLongest

__all__ = [
    "BatchMapper",
    "Batcher",
    "BucketBatcher",
    "Bz2FileLoader",
    "Collator",
    "Concater",
    "CSVDictParser",
    "CSVParser",
    "Cycler",
    "Decompressor",
    "Demultiplexer",
    "Dropper",
    "Enumerator",
    "Extractor",
    "FileLister",
    "FileOpener",
    "Filter",
    "FlatMapper",
    "Flattener",
    "Forker",
    "FSSpecFileLister",
    "FSSpecFileOpener",
    "FSSpecSaver",
    "FullSync",
    "Grouper",
    "HashChecker",
    "Header",
    "HttpReader",
    "IndexAdder",
    "InBatchShuffler",
    "IterableWrapper",
    "IterDataPipe",
    "IterKeyZipper",
    "JsonParser",
    "LengthSetter",
    "LineReader",
    "Mapper",
    "MapKeyZipper",
    "MapToIterConverter",
    "Multiplexer",
    "ParagraphAggregator",
    "PinMemory",
    "Prefetcher",
    "RandomSplitter",
    "Repeater",
    "RoundRobinDemultiplexer",
    "RoutedDecoder",
    "Rows2Columnar",
    "Saver",
    "ShardExpander",
    "ShardingFilter",
    "Shuffler",
    "Slicer",
    "StreamReader",
    "TarArchiveLoader",
    "UnBatcher",
    "UnZipper",
    "WebDataset",
    "XzFileLoader",
    "ZipArchiveLoader",
    "Zipper",
    "ZipperLongest",
    "ShuffledFlatMapper",
    "ThreadPoolMapper",
    "TFRecordLoader",
    "BatchAsyncMapper",
]

from ._add_index import IndexAdder  # noqa: E402
from ._in_batch_shuffle import InBatchShuffler  # noqa: E402

# torchdata's names for pipeloom blocks of another name.
UnBatcher = Unbatcher
StreamReader = StreamChunkReader  # pipeloom.datapipes.StreamReader is a base class
Extractor = Decompressor
Forker = fork
Demultiplexer = demux
UnZipper = unzip
RandomSplitter = random_split
RoundRobinDemultiplexer = round_robin_demux


def _as_pipe(source: Any) -> IterDataPipe:
    return source if isinstance(source, IterDataPipe) else IterableWrapper(source)


def FileLister(  # noqa: N802 - torchdata's class name
    root: str | Sequence[str] | IterDataPipe = ".",
    masks: str | list[str] = "",
    *,
    recursive: bool = False,
    abspath: bool = False,
    non_deterministic: bool = False,
    length: int = -1,
) -> IterDataPipe:
    """torchdata's ``FileLister``: roots as paths, or as a block yielding them."""
    if isinstance(root, IterDataPipe):
        return RootLister(
            root,
            masks,
            recursive=recursive,
            abspath=abspath,
            non_deterministic=non_deterministic,
            length=length,
        )
    lister = _PathLister(
        root, masks, recursive=recursive, abspath=abspath, non_deterministic=non_deterministic
    )
    return lister if length == -1 else lister.set_length(length)


def FileOpener(  # noqa: N802 - torchdata's class name
    datapipe: Iterable[str], mode: str = "r", encoding: str | None = None, length: int = -1
) -> IterDataPipe:
    """torchdata's ``FileOpener``: paths from a block or any iterable."""
    return _as_pipe(datapipe).open_files(mode, encoding, length)


def FSSpecFileLister(  # noqa: N802 - torchdata's class name
    root: str | Sequence[str] | IterDataPipe, masks: str | list[str] = "", **kwargs: Any
) -> IterDataPipe:
    """torchdata's ``FSSpecFileLister``: one URL, a list of URLs, or a block yielding them."""
    if isinstance(root, str):
        return _FSSpecPathLister(root, masks, **kwargs)
    return FSSpecRootLister(_as_pipe(root), masks, **kwargs)


def HttpReader(  # noqa: N802 - torchdata's class name
    source_datapipe: IterDataPipe, timeout: float | None = None, **kwargs: Any
) -> IterDataPipe:
    """torchdata's ``HttpReader`` (see ``read_from_http`` for the arguments kept)."""
    return _as_pipe(source_datapipe).read_from_http(timeout, **kwargs)


def CSVDictParser(source_datapipe: IterDataPipe, **kwargs: Any) -> IterDataPipe:  # noqa: N802
    """torchdata's ``CSVDictParser``: ``parse_csv_as_dict``."""
    return source_datapipe.parse_csv_as_dict(**kwargs)


def Shuffler(  # noqa: N802 - torchdata's class name
    datapipe: IterDataPipe, *, buffer_size: int = 10000, unbatch_level: int = 0
) -> IterDataPipe:
    """torchdata's ``Shuffler``."""
    return datapipe.shuffle(buffer_size, unbatch_level=unbatch_level)


def MapToIterConverter(datapipe: Any, indices: Sequence[Any] | None = None) -> IterDataPipe:  # noqa: N802
    """torchdata's ``MapToIterConverter``: ``to_iter_datapipe``."""
    return datapipe.to_iter_datapipe(indices)
