"""AsyncBatchMapper / async_map_batches: a coroutine over a batch of items at once."""

from __future__ import annotations

import asyncio

import pytest

from pipeloom.datapipes import AsyncBatchMapper, IterableWrapper
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere


async def times_ten(x):
    await asyncio.sleep(0)
    return x * 10


def test_flattened_in_order_with_the_source_length():
    dp = IterableWrapper(range(7)).async_map_batches(times_ten, 3)
    assert list(dp) == [x * 10 for x in range(7)] and len(dp) == 7


def test_columns_and_unflattened_batches():
    rows = IterableWrapper([(i, i) for i in range(4)])
    assert list(rows.async_map_batches(times_ten, 2, input_col=1)) == [
        (i, i * 10) for i in range(4)
    ]
    assert list(rows.async_map_batches(times_ten, 2, input_col=1, output_col=-1))[1] == (1, 1, 10)
    assert list(rows.async_map_batches(times_ten, 3, input_col=0, flatten=False)) == [
        [(0, 0), (10, 1), (20, 2)],
        [(30, 3)],
    ]


def test_max_concurrency_bounds_the_calls_in_flight():
    running, peak = 0, 0

    async def track(x):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)
        running -= 1
        return x

    assert list(IterableWrapper(range(12)).async_map_batches(track, 12, max_concurrency=3)) == list(
        range(12)
    )
    assert peak == 3


def test_errors():
    with pytest.raises(ValueError, match=r"needs a coroutine function \(async def\)"):
        IterableWrapper([]).async_map_batches(lambda x: x, 2)
    with pytest.raises(ValueError, match="max_concurrency must be an int >= 1"):
        IterableWrapper([]).async_map_batches(times_ten, 2, max_concurrency=0)
    with pytest.raises(ValueError, match="output_col needs input_col"):
        IterableWrapper([]).async_map_batches(times_ten, 2, output_col=1)

    async def explode(x):
        raise KeyError(x)

    with pytest.raises(KeyError):
        list(IterableWrapper([1]).async_map_batches(explode, 1))
    assert repr(AsyncBatchMapper(IterableWrapper([]), times_ten)) == (
        "AsyncBatchMapper(async_fn=times_ten, max_concurrency=32)"
    )


def test_resume_from_every_step():
    check_resume_from_every_step(lambda: IterableWrapper(range(5)).async_map_batches(times_ten, 2))


def test_same_output_everywhere():
    epochs = check_same_output_everywhere(
        lambda: IterableWrapper(range(8)).sharding_filter().async_map_batches(times_ten, 3)
    )
    assert sorted(epochs[0]) == [x * 10 for x in range(8)]
