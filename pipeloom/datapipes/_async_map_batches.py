"""``async_map_batches``: a coroutine function over each item, a batch at a time, concurrently."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from ._base import IterDataPipe
from ._context import current_position
from ._map import (
    Col,
    _drop_order,
    _map_append,
    _map_store,
    fn_name,
    parse_input_col,
    raise_with_note,
)

__all__ = ["AsyncBatchMapper", "async_map_batches"]


def async_map_batches(
    source: IterDataPipe,
    async_fn: Callable[..., Any],
    batch_size: int,
    input_col: Col = None,
    output_col: Col = None,
    max_concurrency: int = 32,
    flatten: bool = True,
) -> IterDataPipe:
    """Batch the items, await ``async_fn`` on every item of a batch at once, then unbatch.

    The functional ``async_map_batches``: ``source.batch(batch_size)``, an
    :class:`AsyncBatchMapper`, and (``flatten=True``) ``unbatch()``, with the
    source's length when it has one. ``input_col``/``output_col`` as in ``map``.

    Example:
        >>> import asyncio
        >>> from pipeloom.datapipes import IterableWrapper
        >>> async def times_ten(x):
        ...     await asyncio.sleep(0)
        ...     return x * 10
        >>> list(IterableWrapper(range(5)).async_map_batches(times_ten, 2))
        [0, 10, 20, 30, 40]
    """
    mapped: IterDataPipe = AsyncBatchMapper(
        source.batch(batch_size), async_fn, input_col, output_col, max_concurrency
    )
    if not flatten:
        return mapped
    mapped = mapped.unbatch()
    try:
        return mapped.set_length(len(source))
    except (TypeError, NotImplementedError):
        return mapped


class AsyncBatchMapper(IterDataPipe):
    """Await ``async_fn`` on each item of each batch, at most ``max_concurrency`` at once.

    Each batch runs in an event loop of its own (``asyncio.run``) in the thread
    where the block runs; the result is the batch of results (or of items with
    the result written at ``output_col``).
    """

    inputs = ("source",)
    per_rank_fields = ("max_concurrency",)
    per_item = True
    one_to_one = True

    def __init__(
        self,
        source: IterDataPipe,
        async_fn: Callable[..., Any],
        input_col: Col = None,
        output_col: Col = None,
        max_concurrency: int = 32,
    ) -> None:
        if not inspect.iscoroutinefunction(async_fn):
            raise ValueError(
                f"async_map_batches() needs a coroutine function (async def), got "
                f"{fn_name(async_fn)}; use map() or threadpool_map() for a plain function"
            )
        if (
            isinstance(max_concurrency, bool)
            or not isinstance(max_concurrency, int)
            or max_concurrency < 1
        ):
            raise ValueError(f"max_concurrency must be an int >= 1, got {max_concurrency!r}")
        if input_col is None and output_col is not None:
            raise ValueError("output_col needs input_col: it says where fn(item[input_col]) goes")
        if isinstance(output_col, (list, tuple)):
            if len(output_col) != 1:
                raise ValueError(f"output_col must be a single index or key, got {output_col!r}")
            output_col = output_col[0]
        self._col, self._several = parse_input_col(input_col, "async_map_batches")
        self.source = source
        self.async_fn = async_fn
        self.input_col, self.output_col = input_col, output_col
        self.max_concurrency = max_concurrency

    def async_next(self) -> list[Any]:
        batch = self.source.async_next()
        try:
            results = asyncio.run(self._gather(batch))
        except Exception as error:
            raise_with_note(error, self, current_position())
        return [self._place(item, result) for item, result in zip(batch, results)]

    async def _gather(self, batch: list[Any]) -> list[Any]:
        limit = asyncio.Semaphore(self.max_concurrency)
        col, several = self._col, self._several

        async def one(item: Any) -> Any:
            if several:
                args = [item[c] for c in col]
            else:
                args = [item if col is None else item[col]]
            async with limit:
                return await self.async_fn(*args)

        return list(await asyncio.gather(*(one(item) for item in batch)))

    def _place(self, item: Any, result: Any) -> Any:
        if self._col is None and not self._several:
            return result

        def reader(_: Any) -> Any:
            return result

        if self.output_col is None:
            if self._several:
                return _map_store(reader, self._col[0], _drop_order(self._col[1:]), item)
            return _map_store(reader, self._col, (), item)
        if self.output_col == -1 and not isinstance(self.output_col, bool):
            return _map_append(reader, item)
        return _map_store(reader, self.output_col, (), item)

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        name = fn_name(self.async_fn)
        return f"AsyncBatchMapper(async_fn={name}, max_concurrency={self.max_concurrency})"
