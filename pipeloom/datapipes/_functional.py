"""Functional chaining: ``dp.map(f).batch(4)`` as ordinary, typed methods.

Each method builds the block of the same name with ``self`` as its input.
Custom blocks add a method with :func:`functional_datapipe`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._functional_batching import BatchingFunctional
from ._functional_registry import functional_datapipe
from ._functional_storage import StorageFunctional
from ._functional_streams import StreamFunctional

if TYPE_CHECKING:
    import os

    import torch

    from ._base import IterDataPipe, MapDataPipe

__all__ = ["IterFunctional", "MapFunctional", "functional_datapipe"]

Col = int | str | Sequence[int | str] | None


class IterFunctional(StreamFunctional, StorageFunctional, BatchingFunctional):
    """The chaining methods of every ``IterDataPipe``.

    The mixins hold the methods new with torchdata 0.9's names: item and stream
    reshaping in ``StreamFunctional``, storage and formats in ``StorageFunctional``;
    batching, bucketing, packing and mixing in ``BatchingFunctional``.
    """

    # -- per item ------------------------------------------------------------
    def map(
        self, fn: Callable[..., Any], input_col: Col = None, output_col: Col = None
    ) -> IterDataPipe:
        """Apply ``fn`` to each item (or to ``input_col`` of it). See :class:`Mapper`."""
        from ._map import Mapper

        return Mapper(self, fn, input_col=input_col, output_col=output_col)

    def filter(self, filter_fn: Callable[[Any], bool], input_col: Col = None) -> IterDataPipe:
        """Keep the items for which ``filter_fn`` is true. See :class:`Filter`."""
        from ._filter import Filter

        return Filter(self, filter_fn, input_col=input_col)

    def flatmap(
        self, fn: Callable[[Any], Any] | None = None, input_col: Col = None
    ) -> IterDataPipe:
        """Map each item to an iterable and yield its elements. See :class:`FlatMapper`."""
        from ._flatmap import FlatMapper

        return FlatMapper(self, fn, input_col=input_col)

    def enumerate(self, starting_index: int = 0) -> IterDataPipe:
        """Yield ``(index, item)`` pairs. See :class:`Enumerator`."""
        from ._enumerate import Enumerator

        return Enumerator(self, starting_index)

    def header(self, limit: int = 10) -> IterDataPipe:
        """Yield at most ``limit`` items. See :class:`Header`."""
        from ._header import Header

        return Header(self, limit)

    # -- batching --------------------------------------------------------------
    def batch(
        self, batch_size: int, drop_last: bool = False, wrapper_class: Callable[[list], Any] = list
    ) -> IterDataPipe:
        """Group consecutive items into lists of ``batch_size``. See :class:`Batcher`."""
        from ._batch import Batcher

        return Batcher(self, batch_size, drop_last=drop_last, wrapper_class=wrapper_class)

    def unbatch(self, unbatch_level: int = 1) -> IterDataPipe:
        """Undo ``batch``: yield the elements of each batch. See :class:`Unbatcher`."""
        from ._batch import Unbatcher

        return Unbatcher(self, unbatch_level=unbatch_level)

    def collate(
        self,
        conversion: Callable[[Any], Any] | None = None,
        collate_fn: Callable[[Any], Any] | None = None,
    ) -> IterDataPipe:
        """Turn each batch into tensors (default) or apply ``collate_fn``. See :class:`Collator`.

        torchdata's two arguments: ``collate_fn`` wins; else a callable
        ``conversion`` is the collate function.
        """
        from ._collate import Collator, check_conversion

        return Collator(
            self, collate_fn if collate_fn is not None else check_conversion(conversion)
        )

    def in_batch_shuffle(self, *, seed: int | None = None) -> IterDataPipe:
        """Shuffle the items inside each batch. See :class:`InBatchShuffler`."""
        from ._in_batch_shuffle import InBatchShuffler

        return InBatchShuffler(self, seed=seed)

    # -- order and sharding ------------------------------------------------------
    def shuffle(
        self, buffer_size: int = 10000, *, unbatch_level: int = 0, seed: int | None = None
    ) -> IterDataPipe:
        """Shuffle through a buffer of ``buffer_size`` items. See :class:`Shuffler`.

        ``unbatch_level`` (torchdata's argument) unbatches that many levels first.
        """
        from ._shuffle import Shuffler

        source = self.unbatch(unbatch_level) if unbatch_level else self
        return Shuffler(source, buffer_size=buffer_size, seed=seed)

    def sharding_filter(self, sharding_group_filter: Any = None) -> IterDataPipe:
        """Mark where a reading service splits the stream. See :class:`ShardingFilter`.

        ``sharding_group_filter`` (torchdata's argument) may only be None or
        ``SHARDING_PRIORITIES.DEFAULT``: one sharding point splits the data
        across ranks and workers together.
        """
        from ._sharding import ShardingFilter, check_sharding_group

        check_sharding_group(sharding_group_filter)
        return ShardingFilter(self)

    def cycle(self, count: int | None = None) -> IterDataPipe:
        """Repeat the stream ``count`` times (forever if None). See :class:`Cycler`."""
        from ._cycle import Cycler

        return Cycler(self, count)

    def prefetch(self, buffer_size: int = 10) -> IterDataPipe:
        """Run the upstream ahead in a background thread. See :class:`Prefetcher`."""
        from ._prefetch import Prefetcher

        return Prefetcher(self, buffer_size)

    # -- devices ------------------------------------------------------------------
    def pin_memory(
        self,
        device: str | torch.device | int | None = None,
        buffer_size: int = 2,
        *,
        pin_memory_fn: Callable[[Any, Any], Any] | None = None,
    ) -> IterDataPipe:
        """Pin tensors' host memory, one batch ahead in a thread. See :class:`PinMemory`."""
        from ._device import PinMemory

        return PinMemory(self, device, buffer_size=buffer_size, pin_memory_fn=pin_memory_fn)

    def to_device(
        self, device: str | torch.device | int, non_blocking: bool = True, buffer_size: int = 2
    ) -> IterDataPipe:
        """Copy tensors to ``device``, one batch ahead in a thread. See :class:`ToDevice`."""
        from ._device import ToDevice

        return ToDevice(self, device, non_blocking=non_blocking, buffer_size=buffer_size)

    # -- several streams ----------------------------------------------------------
    def zip(self, *others: IterDataPipe) -> IterDataPipe:
        """Yield tuples of one item from each stream. See :class:`Zipper`."""
        from ._zip import Zipper

        return Zipper(self, *others)

    def concat(self, *others: IterDataPipe) -> IterDataPipe:
        """Yield this stream, then each of ``others``. See :class:`Concater`."""
        from ._concat import Concater

        return Concater(self, *others)

    def fork(
        self, num_instances: int, buffer_size: int = 1000, copy: str | None = None
    ) -> list[IterDataPipe]:
        """Copy the stream to ``num_instances`` consumers. See :class:`Forker`."""
        from ._fork import fork

        return fork(self, num_instances, buffer_size=buffer_size, copy=copy)

    def demux(
        self,
        num_instances: int,
        classifier_fn: Callable[[Any], int | None],
        drop_none: bool = False,
        buffer_size: int = 1000,
    ) -> list[IterDataPipe]:
        """Split the stream by ``classifier_fn``. See :class:`Demultiplexer`."""
        from ._demux import demux

        return demux(
            self, num_instances, classifier_fn, drop_none=drop_none, buffer_size=buffer_size
        )

    # -- storage -------------------------------------------------------------------
    def open_files(
        self, mode: str = "r", encoding: str | None = None, length: int = -1
    ) -> IterDataPipe:
        """Open each path; yield ``(path, stream)``. See :class:`FileOpener`.

        ``length`` (torchdata's argument) declares ``len()`` with ``set_length``.
        """
        from ._files import FileOpener

        opener = FileOpener(self, mode=mode, encoding=encoding)
        return opener if length == -1 else opener.set_length(length)

    def load_from_tar(
        self,
        mode: str = "r|*",
        length: int = -1,
        on_error: str = "raise",
        max_member_size: int | None = 1 << 32,
    ) -> IterDataPipe:
        """Read tar members from ``(path, stream)`` items. See :class:`TarArchiveLoader`."""
        from ._tar import TarArchiveLoader

        return TarArchiveLoader(
            self, mode=mode, length=length, on_error=on_error, max_member_size=max_member_size
        )

    def webdataset(self) -> IterDataPipe:
        """Group consecutive tar members by key into samples. See :class:`WebDataset`."""
        from ._webdataset import WebDataset

        return WebDataset(self)

    def decode(
        self, *, strict: bool = False, decoders: dict[str, Callable[[bytes], Any]] | None = None
    ) -> IterDataPipe:
        """Decode ``(name, bytes)`` items or sample dicts by extension. See :class:`Decoder`."""
        from ._decode import Decoder

        return Decoder(self, strict=strict, decoders=decoders)

    def readlines(
        self,
        *,
        skip_lines: int = 0,
        strip_newline: bool = True,
        decode: bool = False,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = True,
    ) -> IterDataPipe:
        """Yield the lines of each ``(path, stream)``. See :class:`LineReader`."""
        from ._text import LineReader

        return LineReader(
            self,
            skip_lines=skip_lines,
            strip_newline=strip_newline,
            decode=decode,
            encoding=encoding,
            errors=errors,
            return_path=return_path,
        )

    def parse_csv(
        self,
        *,
        skip_lines: int = 0,
        decode: bool = True,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = False,
        as_tuple: bool = False,
        as_dict: bool = False,
        delimiter: str = ",",
        **fmtparams: Any,
    ) -> IterDataPipe:
        """Yield the rows of each ``(path, stream)`` of CSV text. See :class:`CSVParser`."""
        from ._text import CSVParser

        return CSVParser(
            self,
            skip_lines=skip_lines,
            decode=decode,
            encoding=encoding,
            errors=errors,
            return_path=return_path,
            as_tuple=as_tuple,
            as_dict=as_dict,
            delimiter=delimiter,
            **fmtparams,
        )

    # -- caching -------------------------------------------------------------------
    def in_memory_cache(
        self, size: int | float | None = None, *, allow_random: bool = False
    ) -> IterDataPipe:
        """Keep the first epoch's items in memory (at most ``size`` MiB); replay them after.

        See :class:`InMemoryCacheHolder`.
        """
        from ._in_memory_cache import InMemoryCacheHolder

        return InMemoryCacheHolder(self, size, allow_random=allow_random)

    def on_disk_cache(
        self,
        filepath_fn: Callable[[Any], str] | None = None,
        hash_dict: dict[str, str] | None = None,
        hash_type: str = "sha256",
        extra_check_fn: Callable[[str], bool] | None = None,
    ) -> IterDataPipe:
        """Skip to ``end_caching`` for items whose file exists. See :class:`OnDiskCacheHolder`."""
        from ._on_disk_cache import OnDiskCacheHolder

        return OnDiskCacheHolder(
            self,
            filepath_fn=filepath_fn,
            hash_dict=hash_dict,
            hash_type=hash_type,
            extra_check_fn=extra_check_fn,
        )

    def end_caching(
        self,
        mode: str = "wb",
        filepath_fn: Callable[[Any], str] | None = None,
        *,
        same_filepath_fn: bool = False,
        skip_read: bool = False,
        timeout: float | None = 300,
    ) -> IterDataPipe:
        """Write ``(key, data)`` to files, yield the paths. See :class:`EndOnDiskCacheHolder`."""
        from ._on_disk_cache import EndOnDiskCacheHolder

        return EndOnDiskCacheHolder(
            self,
            mode=mode,
            filepath_fn=filepath_fn,
            same_filepath_fn=same_filepath_fn,
            skip_read=skip_read,
            timeout=timeout,
        )

    def snapshot(
        self,
        path: str | os.PathLike[str],
        *,
        key: str | None = None,
        allow_random: bool = False,
        shard_size: int = 256,
    ) -> IterDataPipe:
        """Store this edge's items on disk once, keyed by the upstream. See :class:`Snapshot`."""
        from ._snapshot import Snapshot

        return Snapshot(self, path, key=key, allow_random=allow_random, shard_size=shard_size)


class MapFunctional:
    """The chaining methods of every ``MapDataPipe``."""

    def map(
        self, fn: Callable[..., Any] | None = None, input_col: Col = None, output_col: Col = None
    ) -> MapDataPipe:
        """Apply ``fn`` (None: the identity) to each item on access. See :class:`MapMapper`."""
        from ._map import MapMapper

        return MapMapper(
            self, _same if fn is None else fn, input_col=input_col, output_col=output_col
        )

    def batch(
        self, batch_size: int, drop_last: bool = False, wrapper_class: Callable[[list], Any] = list
    ) -> MapDataPipe:
        """Index ``i`` is items ``[i*batch_size, (i+1)*batch_size)``. See :class:`MapBatcher`."""
        from ._batch import MapBatcher

        return MapBatcher(self, batch_size, drop_last=drop_last, wrapper_class=wrapper_class)

    def shuffle(
        self, *, indices: Sequence[Any] | None = None, seed: int | None = None
    ) -> IterDataPipe:
        """Iterate the items in a random order (an ``IterDataPipe``). See :class:`MapShuffler`."""
        from ._shuffle import MapShuffler

        return MapShuffler(self, indices=indices, seed=seed)

    def concat(self, *others: MapDataPipe) -> MapDataPipe:
        """Index past this pipe's end continues into ``others``. See :class:`MapConcater`."""
        from ._concat import MapConcater

        return MapConcater(self, *others)

    def zip(self, *others: MapDataPipe) -> MapDataPipe:
        """Index ``i`` returns a tuple of item ``i`` of each pipe. See :class:`MapZipper`."""
        from ._zip import MapZipper

        return MapZipper(self, *others)

    def in_memory_cache(self) -> MapDataPipe:
        """Keep each item once read. See :class:`MapInMemoryCacheHolder`."""
        from ._map_cache import MapInMemoryCacheHolder

        return MapInMemoryCacheHolder(self)

    def to_iter(self) -> IterDataPipe:
        """Iterate indices ``0..len-1`` in order (an ``IterDataPipe``). See :class:`MapToIter`."""
        from ._wrappers import MapToIter

        return MapToIter(self)

    def to_iter_datapipe(self, indices: Sequence[Any] | None = None) -> IterDataPipe:
        """Iterate the items at ``indices`` (default: all, in order), torchdata's name.

        Without ``indices`` this is :meth:`to_iter`; with them, the items
        ``self[i]`` for ``i`` in ``indices`` (which may be keys).
        """
        from ._wrappers import IterableWrapper, MapToIter

        if indices is None:
            return MapToIter(self)
        return IterableWrapper(list(indices)).zip_with_map(self, _same, merge_fn=_second)

    def unzip(
        self, sequence_length: int, columns_to_skip: Sequence[int] | None = None
    ) -> list[MapDataPipe]:
        """One map-style block per position of the items. See :func:`unzip_map`."""
        from ._unzip import unzip_map

        return unzip_map(self, sequence_length, columns_to_skip)


def _same(index: Any) -> Any:
    return index


def _second(index: Any, value: Any) -> Any:
    return value
