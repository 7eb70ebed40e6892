"""ThreadPoolMapper (threadpool_map): map in a thread pool, results in order."""

from __future__ import annotations

import threading

import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, ThreadPoolMapper, item_rng
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.everywhere import check_same_output_everywhere
from tests.datapipes.helpers import Flaky


def square(x):
    return x * x


def test_results_in_input_order_with_columns():
    assert list(IterableWrapper(range(20)).threadpool_map(square, max_workers=4)) == [
        x * x for x in range(20)
    ]
    rows = IterableWrapper([(1, 2), (3, 4)])
    assert list(rows.threadpool_map(square, input_col=1, output_col=-1)) == [(1, 2, 4), (3, 4, 16)]


def test_calls_run_concurrently():
    barrier = threading.Barrier(3, timeout=20)

    def meet(x):
        barrier.wait()  # passes only when three calls run at the same time
        return x

    assert list(IterableWrapper(range(6)).threadpool_map(meet, max_workers=3)) == list(range(6))


def test_item_rng_draws_for_the_item_whatever_the_thread():
    def draw(x):
        return int(item_rng().integers(10**9))

    threaded = collect(IterableWrapper(range(30)).threadpool_map(draw, max_workers=4), seed=3)
    assert threaded == collect(IterableWrapper(range(30)).map(draw), seed=3)


def test_draws_in_the_pool_count_for_the_item_as_map_draws_do():
    # A block after it draws the item's next seeds, not the one the pool thread drew,
    # and in_memory_cache sees that the item drew (it refuses without allow_random,
    # and after a resume replays the fill epoch's draws).
    def draw(x):
        return int(item_rng().integers(10**9))

    def pair(x):
        return (x, draw(x))

    threaded = IterableWrapper(range(6)).threadpool_map(draw, max_workers=2).map(pair)
    mapped = IterableWrapper(range(6)).map(draw).map(pair)
    assert collect(threaded, seed=3) == collect(mapped, seed=3)
    assert all(a != b for a, b in collect(threaded, seed=3))
    cached = IterableWrapper(range(3)).threadpool_map(draw, max_workers=2).in_memory_cache()
    with pytest.raises(RuntimeError, match="drew from item_rng"):
        collect(cached, seed=3)


def test_a_cache_after_it_replays_its_draws_after_a_resume():
    def build():
        pipe = IterableWrapper(range(8)).threadpool_map(draw_digits, max_workers=2)
        return pipe.in_memory_cache(allow_random=True)

    with DataLoader(build(), seed=1) as loader:
        expected = [list(loader), list(loader)]
    stopped = DataLoader(build(), seed=1)
    epoch = iter(stopped)
    head = [next(epoch) for _ in range(3)]
    state = stopped.state_dict()
    stopped.shutdown()
    with DataLoader(build(), seed=1) as resumed:
        resumed.load_state_dict(state)
        assert [head + list(resumed), list(resumed)] == expected  # the head: epoch 0's draws


def draw_digits(x):
    return x * 1000 + int(item_rng().integers(1000))


def test_survives_an_upstream_that_is_not_ready():
    assert collect_async(ThreadPoolMapper(Flaky(range(15), seed=2), square, scheduled_tasks=4)) == [
        x * x for x in range(15)
    ]


def test_errors():
    def explode(x):
        if x == 3:
            raise KeyError("three")
        return x

    with pytest.raises(KeyError, match="three") as caught:
        list(IterableWrapper(range(5)).threadpool_map(explode))
    assert "position 3" in "\n".join(caught.value.__notes__)
    with pytest.raises(ValueError, match="scheduled_tasks must be an int >= 1, got 0"):
        IterableWrapper([]).threadpool_map(square, scheduled_tasks=0)
    with pytest.raises(ValueError, match="max_workers must be an int >= 1 or None"):
        IterableWrapper([]).threadpool_map(square, max_workers=0)
    with pytest.raises(TypeError, match=r"passes \['colour'\] to ThreadPoolExecutor"):
        IterableWrapper([]).threadpool_map(square, colour=1)
    assert repr(ThreadPoolMapper(IterableWrapper([]), square, scheduled_tasks=8)) == (
        "ThreadPoolMapper(fn=square, scheduled_tasks=8, max_workers=None)"
    )


def test_resume_from_every_step():
    check_resume_from_every_step(
        lambda: IterableWrapper(range(9)).threadpool_map(square, scheduled_tasks=3, max_workers=2)
    )


def test_same_output_everywhere():
    epochs = check_same_output_everywhere(
        lambda: (
            IterableWrapper(range(12))
            .shuffle()
            .sharding_filter()
            .threadpool_map(square, max_workers=2)
        )
    )
    assert sorted(epochs[0]) == [x * x for x in range(12)]
