"""Chaining methods that reshape items and streams (a mixin of ``IterFunctional``).

Column selection, repetition, lengths, indexing, key joins, grouping,
splitting and synchronisation, with torchdata 0.9's names and arguments.
Each method builds the block it names with ``self`` as its input.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._base import IterDataPipe, MapDataPipe

__all__ = ["StreamFunctional"]


class StreamFunctional:
    """Item and stream reshaping methods of every ``IterDataPipe``."""

    # -- lengths ---------------------------------------------------------------------
    def set_length(self, length: int) -> IterDataPipe:
        """Pass items through; ``len()`` returns ``length``. See :class:`LengthSetter`."""
        from ._set_length import LengthSetter

        return LengthSetter(self, length)

    # -- columns ---------------------------------------------------------------------
    def rows2columnar(self, column_names: Sequence[str] | None = None) -> IterDataPipe:
        """Turn each batch of rows into a dict of columns. See :class:`Rows2Columnar`."""
        from ._rows2columnar import Rows2Columnar

        return Rows2Columnar(self, column_names)

    def drop(self, indices: Hashable | list[Hashable]) -> IterDataPipe:
        """Remove columns from each item. See :class:`Dropper`."""
        from ._columns import Dropper

        return Dropper(self, indices)

    def slice(
        self, index: int | list[Hashable], stop: int | None = None, step: int | None = None
    ) -> IterDataPipe:
        """Keep a slice or a set of columns of each item. See :class:`Slicer`."""
        from ._columns import Slicer

        return Slicer(self, index, stop, step)

    def flatten(self, indices: Hashable | list[Hashable] | None = None) -> IterDataPipe:
        """Splice nested columns into their item. See :class:`Flattener`."""
        from ._columns import Flattener

        return Flattener(self, indices)

    def add_index(self, index_name: str = "index") -> IterDataPipe:
        """Number dict items in the field ``index_name``. See :class:`IndexAdder`."""
        from ._add_index import IndexAdder

        return IndexAdder(self, index_name)

    # -- repetition and expansion ----------------------------------------------------
    def repeat(self, times: int) -> IterDataPipe:
        """Yield each item ``times`` times in a row. See :class:`Repeater`."""
        from ._repeat import Repeater

        return Repeater(self, times)

    def shard_expand(self) -> IterDataPipe:
        """Expand brace patterns like ``"ds-{00..99}.tar"``. See :class:`ShardExpander`."""
        from ._shard_expand import ShardExpander

        return ShardExpander(self)

    # -- joining ---------------------------------------------------------------------
    def zip_longest(self, *others: IterDataPipe, fill_value: Any = None) -> IterDataPipe:
        """Zip until the longest stream ends. See :class:`ZipperLongest`."""
        from ._zip_longest import ZipperLongest

        return ZipperLongest(self, *others, fill_value=fill_value)

    def zip_with_iter(
        self,
        ref_datapipe: IterDataPipe,
        key_fn: Callable[[Any], Any],
        ref_key_fn: Callable[[Any], Any] | None = None,
        keep_key: bool = False,
        buffer_size: int | None = 10000,
        merge_fn: Callable[[Any, Any], Any] | None = None,
    ) -> IterDataPipe:
        """Pair items with the same-key item of ``ref_datapipe``. See :class:`IterKeyZipper`."""
        from ._key_zip import IterKeyZipper

        return IterKeyZipper(
            self, ref_datapipe, key_fn, ref_key_fn, keep_key, buffer_size, merge_fn
        )

    def zip_with_map(
        self,
        map_datapipe: MapDataPipe,
        key_fn: Callable[[Any], Any],
        merge_fn: Callable[[Any, Any], Any] | None = None,
        keep_key: bool = False,
    ) -> IterDataPipe:
        """Pair each item with ``map_datapipe[key_fn(item)]``. See :class:`MapKeyZipper`."""
        from ._key_zip import MapKeyZipper

        return MapKeyZipper(self, map_datapipe, key_fn, merge_fn, keep_key)

    # -- grouping and splitting --------------------------------------------------------
    def groupby(
        self,
        group_key_fn: Callable[[Any], Any],
        *,
        keep_key: bool = False,
        buffer_size: int | None = 10000,
        group_size: int | None = None,
        guaranteed_group_size: int | None = None,
        drop_remaining: bool = False,
    ) -> IterDataPipe:
        """Collect items with the same key into lists. See :class:`Grouper`."""
        from ._groupby import Grouper

        return Grouper(
            self,
            group_key_fn,
            keep_key=keep_key,
            buffer_size=buffer_size,
            group_size=group_size,
            guaranteed_group_size=guaranteed_group_size,
            drop_remaining=drop_remaining,
        )

    def random_split(
        self,
        weights: Mapping[Hashable, float],
        seed: int,
        total_length: int | None = None,
        target: Hashable | None = None,
    ) -> Any:
        """Split the stream at random into named parts. See :func:`random_split`.

        Returns a list of blocks (one per key of ``weights``), or the
        ``target`` part alone.
        """
        from ._random_split import random_split

        return random_split(self, weights, seed, total_length, target)

    def unzip(
        self,
        sequence_length: int,
        buffer_size: int = 1000,
        columns_to_skip: Sequence[int] | None = None,
    ) -> list[IterDataPipe]:
        """Split a stream of sequences into one stream per position. See :func:`unzip`."""
        from ._unzip import unzip

        return unzip(self, sequence_length, buffer_size, columns_to_skip)

    def round_robin_demux(self, num_instances: int, buffer_size: int = 1000) -> list[IterDataPipe]:
        """Deal items out to ``num_instances`` streams in turn. See :func:`round_robin_demux`."""
        from ._round_robin import round_robin_demux

        return round_robin_demux(self, num_instances, buffer_size)

    # -- functions over runs of items ---------------------------------------------------
    def threadpool_map(
        self,
        fn: Callable[..., Any],
        input_col: int | str | Sequence[int | str] | None = None,
        output_col: int | str | Sequence[int | str] | None = None,
        scheduled_tasks: int = 128,
        max_workers: int | None = None,
        **threadpool_kwargs: Any,
    ) -> IterDataPipe:
        """``map`` with the calls in a thread pool, order kept. See :class:`ThreadPoolMapper`."""
        from ._threadpool_map import ThreadPoolMapper

        return ThreadPoolMapper(
            self, fn, input_col, output_col, scheduled_tasks, max_workers, **threadpool_kwargs
        )

    def async_map_batches(
        self,
        async_fn: Callable[..., Any],
        batch_size: int,
        input_col: int | str | Sequence[int | str] | None = None,
        output_col: int | str | Sequence[int | str] | None = None,
        max_concurrency: int = 32,
        flatten: bool = True,
    ) -> IterDataPipe:
        """Await ``async_fn`` on a batch of items at once. See :func:`async_map_batches`."""
        from ._async_map_batches import async_map_batches

        return async_map_batches(
            self, async_fn, batch_size, input_col, output_col, max_concurrency, flatten
        )

    def shuffled_flatmap(
        self,
        fn: Callable[[Any], Any] | None = None,
        input_col: int | str | Sequence[int | str] | None = None,
        buffer_size: int = 100,
        *,
        seed: int | None = None,
    ) -> IterDataPipe:
        """``flatmap`` with the expansions of several items interleaved at random.

        See :class:`ShuffledFlatMapper`.
        """
        from ._shuffled_flatmap import ShuffledFlatMapper

        return ShuffledFlatMapper(self, fn, input_col, buffer_size, seed=seed)

    def map_batches(
        self,
        fn: Callable[[list[Any]], Any],
        batch_size: int,
        input_col: int | str | Sequence[int | str] | None = None,
    ) -> IterDataPipe:
        """Call ``fn`` on runs of items; yield its results. See :class:`BatchMapper`."""
        from ._map_batches import BatchMapper

        return BatchMapper(self, fn, batch_size, input_col)

    # -- ranks -------------------------------------------------------------------------
    def fullsync(self, timeout: float = 1800) -> IterDataPipe:
        """End the epoch on every ``torch.distributed`` rank together. See :class:`FullSync`."""
        from ._fullsync import FullSync

        return FullSync(self, timeout)

    # -- to map-style -------------------------------------------------------------------
    def to_map_datapipe(self, key_value_fn: Callable[[Any], Any] | None = None) -> MapDataPipe:
        """Read the stream into a map-style block by key. See :class:`IterToMapConverter`."""
        from ._to_map import IterToMapConverter

        return IterToMapConverter(self, key_value_fn)

    # -- torchdata names pipeloom answers differently -----------------------------------
    def sharding_round_robin_dispatch(self, sharding_group_filter: Any = None) -> IterDataPipe:
        """torchdata's dispatching process: refused, with how to port (see the message)."""
        raise NotImplementedError(
            "sharding_round_robin_dispatch() is not needed in pipeloom: use .sharding_filter() "
            "at the same place. Workers replicate the cheap part before it deterministically and "
            "keep their share of the items in order; to run a block that must not be replicated "
            "(a stream that can be read once) in a process of its own, mark it with "
            "is_separate_process() (see docs/reading_services.md)"
        )
