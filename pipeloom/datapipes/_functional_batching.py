"""Chaining methods that batch, bucket, pack and mix streams (a mixin of ``IterFunctional``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._base import IterDataPipe

__all__ = ["BatchingFunctional"]


class BatchingFunctional:
    """``padded_batch``, ``bucketbatch``, ``bucket_by_length``, ``max_token_bucketize``,
    ``pack``, ``concat_then_split``, ``mux`` and ``mux_longest``."""

    def padded_batch(
        self,
        batch_size: int,
        drop_last: bool = False,
        pad_value: float | Mapping[str, float] = 0,
        pad_to_multiple_of: int | None = None,
        *,
        length_key: str | None = None,
        mask_key: str | None = "attention_mask",
        lengths_key: str | None = "lengths",
    ) -> IterDataPipe:
        """Batch sequences padded to the longest: ``batch`` + ``collate(PadCollate(...))``.

        See :class:`PadCollate` for the output.
        """
        from ._padded_batch import PadCollate

        pad = PadCollate(
            pad_value,
            pad_to_multiple_of,
            length_key=length_key,
            mask_key=mask_key,
            lengths_key=lengths_key,
        )
        return self.batch(batch_size, drop_last=drop_last).collate(pad)  # type: ignore[attr-defined]

    def bucketbatch(
        self,
        batch_size: int,
        drop_last: bool = False,
        batch_num: int = 100,
        bucket_num: int = 1,
        sort_key: Callable[[list], list] | None = None,
        use_in_batch_shuffle: bool = True,
    ) -> IterDataPipe:
        """Batch items of similar size together. See :class:`BucketBatcher`."""
        from ._bucketbatch import BucketBatcher

        return BucketBatcher(
            self,
            batch_size,
            drop_last=drop_last,
            batch_num=batch_num,
            bucket_num=bucket_num,
            sort_key=sort_key,
            use_in_batch_shuffle=use_in_batch_shuffle,
        )

    def bucket_by_length(
        self,
        length_fn: Callable[[Any], int],
        *,
        boundaries: Sequence[int] | None = None,
        num_buckets: int | None = None,
        batch_sizes: int | Sequence[int] | None = None,
        max_tokens: int | None = None,
        buffer_size: int = 1000,
        drop_last: bool = False,
    ) -> IterDataPipe:
        """Batch items of similar ``length_fn`` together. See :class:`LengthBucketer`."""
        from ._bucket_by_length import LengthBucketer

        return LengthBucketer(
            self,
            length_fn,
            boundaries=boundaries,
            num_buckets=num_buckets,
            batch_sizes=batch_sizes,
            max_tokens=max_tokens,
            buffer_size=buffer_size,
            drop_last=drop_last,
        )

    def max_token_bucketize(
        self,
        max_token_count: int,
        len_fn: Callable[[Any], int] = len,
        min_len: int = 0,
        max_len: int | None = None,
        buffer_size: int = 1000,
        include_padding: bool = False,
    ) -> IterDataPipe:
        """Batches within a token budget, torchdata 0.9's. See :class:`MaxTokenBucketizer`."""
        from ._max_token_bucketize import MaxTokenBucketizer

        return MaxTokenBucketizer(
            self, max_token_count, len_fn, min_len, max_len, buffer_size, include_padding
        )

    def pack(
        self,
        max_length: int,
        strategy: str = "best_fit",
        buffer_size: int = 32,
        *,
        pad_value: float | Mapping[str, float] = 0,
        oversized: str = "split",
    ) -> IterDataPipe:
        """Pack sequences into rows of ``max_length`` with segment ids. See :class:`Packer`."""
        from ._pack import Packer

        return Packer(
            self, max_length, strategy, buffer_size, pad_value=pad_value, oversized=oversized
        )

    def concat_then_split(
        self,
        max_length: int,
        *,
        pad_value: float | Mapping[str, float] = 0,
        drop_remainder: bool = False,
    ) -> IterDataPipe:
        """Concatenate sequences, cut rows of ``max_length``. See :class:`ConcatSplitter`."""
        from ._concat_then_split import ConcatSplitter

        return ConcatSplitter(self, max_length, pad_value=pad_value, drop_remainder=drop_remainder)

    def mux(
        self,
        *others: IterDataPipe,
        weights: Sequence[float] | None = None,
        stop: str = "first",
        sampling: str = "smooth",
        seed: int | None = None,
    ) -> IterDataPipe:
        """Interleave streams, round-robin or at ``weights``. See :class:`Multiplexer`."""
        from ._mux import Multiplexer

        return Multiplexer(self, *others, weights=weights, stop=stop, sampling=sampling, seed=seed)

    def mux_longest(self, *others: IterDataPipe) -> IterDataPipe:
        """Round-robin until every stream is exhausted. See :class:`Multiplexer`."""
        from ._mux import Multiplexer

        return Multiplexer(self, *others, stop="all")
