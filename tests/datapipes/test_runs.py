"""Fused per-item runs (``_runs.py``): exactly what the blocks one by one would do.

Each property compares a pipeline whose ``batch`` pulls fused runs with the
same graph whose batcher pulls one item at a time through ``async_next``, over
a source read by iteration (the sharding point filters a full pass there):
items, order, ``item_rng()`` draws, errors (type, message, notes, and what
comes after them), checkpoints and resumes must all be the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import (
    Batcher,
    IterableWrapper,
    IterDataPipe,
    MapDataPipe,
    Mapper,
    SequenceWrapper,
    item_rng,
    load_pipeline_state_dict,
    pipeline_state_dict,
    seed_pipeline,
    set_pipeline_epoch,
)
from pipeloom.datapipes._runs import RunReader
from pipeloom.datapipes.runtime import current_stamp, restore_stamp
from pipeloom.errors import NotAvailable


class Opaque:
    """A re-iterable the sources cannot index: read by iteration only."""

    def __init__(self, items: list[int]) -> None:
        self.items = items

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


class Indexable(MapDataPipe):
    """A custom map-style block (it stamps nothing itself)."""

    def __init__(self, items: list[int]) -> None:
        self.items = items

    def __getitem__(self, index: int) -> int:
        return self.items[index]

    def __len__(self) -> int:
        return len(self.items)

    def state_dict(self) -> dict:
        return {}


class OneByOne(Batcher):
    """A batcher that pulls single items through ``async_next`` (the unfused reference)."""

    def async_next(self) -> Any:
        batch = self._batch
        try:
            while len(batch) < self.batch_size:
                batch.append(self.source.async_next())
                if len(batch) == 1:
                    self._first_stamp = current_stamp()
        except StopIteration:
            if not batch or self.drop_last:
                batch.clear()
                raise
        self._batch = []
        restore_stamp(self._first_stamp)
        return batch


class PassOn(IterDataPipe):
    """A custom block: a boundary of fused runs (read with ``async_next``)."""

    inputs = ("source",)

    def __init__(self, source: Any) -> None:
        self.source = source

    def async_next(self) -> Any:
        return self.source.async_next()

    def state_dict(self) -> dict:
        return {}


def draw(x: int) -> tuple[int, float]:
    return x, float(item_rng().random())


def redraw(item: tuple[int, float]) -> tuple[int, float, float]:
    return (*item, float(item_rng().random()))


class Bad(Exception):
    pass


def failing_on(bad: frozenset[int]):
    def check(item):
        if (item[0] if isinstance(item, tuple) else item) in bad:
            raise Bad(f"bad item {item!r}")
        return item

    return check


def keep(modulus: int):
    return lambda item: (item[0] if isinstance(item, tuple) else item) % modulus != 1


SOURCES = ("list", "tuple", "range", "ndarray", "opaque", "map_to_iter", "custom_map")

stage_lists = st.lists(
    st.sampled_from(["draw", "redraw", "filter2", "filter3", "fail", "set_length", "custom"]),
    max_size=4,
)


def build(spec: dict, fused: bool) -> Any:
    n, kind = spec["n"], spec["source"]
    items = list(range(n))
    if kind == "map_to_iter":
        pipe = SequenceWrapper(items).to_iter()
    elif kind == "custom_map":
        pipe = Indexable(items).to_iter()
    else:
        source = {
            "list": items,
            "tuple": tuple(items),
            "range": range(n),
            "ndarray": np.arange(n),
            "opaque": Opaque(items),
        }[kind]
        # the reference reads the same items by iteration only
        pipe = IterableWrapper(source if fused else Opaque(list(source)))
    if spec["shard"] is not None:
        total, index, group = spec["shard"]
        pipe = pipe.sharding_filter()
        pipe.sharding_settings(total, min(index, total - 1))
        pipe.set_shard_group_size(group)
    drawn = False
    for stage in spec["stages"]:
        if not drawn and stage in ("draw", "redraw"):
            pipe, drawn = pipe.map(draw), True
        elif stage in ("draw", "redraw"):
            pipe = pipe.map(redraw)
        elif stage.startswith("filter"):
            pipe = pipe.filter(keep(int(stage[-1])))
        elif stage == "fail":
            pipe = pipe.map(failing_on(spec["bad"]))
        elif stage == "custom":
            pipe = PassOn(pipe)
        else:
            pipe = pipe.set_length(n)
    batcher = Batcher if fused else OneByOne
    return batcher(pipe, spec["batch"], drop_last=spec["drop_last"])


specs = st.fixed_dictionaries(
    {
        "n": st.integers(0, 30),
        "source": st.sampled_from(SOURCES),
        "shard": st.none() | st.tuples(st.integers(1, 3), st.integers(0, 2), st.integers(1, 3)),
        "stages": stage_lists,
        "bad": st.frozensets(st.integers(0, 30), max_size=4),
        "batch": st.integers(1, 5),
        "drop_last": st.booleans(),
        "seed": st.none() | st.integers(0, 3),
        "epoch": st.integers(0, 1),
    }
)


def start(pipe: Any, spec: dict) -> Any:
    if spec["seed"] is None:
        torch.manual_seed(1234)  # epoch seeds are drawn from torch's generator
    seed_pipeline(pipe, spec["seed"])
    set_pipeline_epoch(pipe, spec["epoch"])
    return iter(pipe)


def outcome(error: BaseException) -> tuple:
    return (type(error).__name__, str(error), tuple(getattr(error, "__notes__", ())))


def comparable(state: dict) -> dict:
    for block in state["blocks"]:
        if block["type"] == "OneByOne":
            block["type"] = "Batcher"  # the reference's batcher: same state
            block.pop("outputs", None)  # what the block base keeps of a user block's input
    return state


def events(pipe: Any, it: Any, limit: int = 200) -> list:
    """Each output, or the error raised instead, with the pipeline's state after it."""
    seen: list = []
    for _ in range(limit):
        try:
            seen.append(("item", next(it)))
        except StopIteration:
            return seen
        except Bad as error:
            seen.append(("error", outcome(error)))
        seen.append(("state", comparable(pipeline_state_dict(pipe)), current_stamp()))
    raise AssertionError("the pipeline did not end")


@settings(max_examples=150, deadline=None)
@given(spec=specs)
def test_runs_give_what_the_blocks_one_by_one_give(spec):
    reference = build(spec, fused=False)
    expected = events(reference, start(reference, spec))
    fused = build(spec, fused=True)
    assert events(fused, start(fused, spec)) == expected


@settings(max_examples=100, deadline=None)
@given(spec=specs, data=st.data())
def test_resuming_a_fused_pipeline_anywhere_gives_the_rest(spec, data):
    reference = build(spec, fused=False)
    expected = [e for e in events(reference, start(reference, spec)) if e[0] != "state"]
    outputs = sum(1 for e in expected if e[0] != "state")
    step = data.draw(st.integers(0, outputs), label="step")
    pipe = build(spec, fused=True)
    it = start(pipe, spec)
    head = [e for e in events_upto(it, step)]
    state = pipeline_state_dict(pipe)
    resumed = build(spec, fused=True)
    it = start(resumed, spec)
    load_pipeline_state_dict(resumed, state)
    tail = [e for e in events(resumed, it) if e[0] != "state"]
    assert head + tail == expected


def events_upto(it: Any, count: int) -> list:
    seen: list = []
    while len(seen) < count:
        try:
            seen.append(("item", next(it)))
        except StopIteration:
            break
        except Bad as error:
            seen.append(("error", outcome(error)))
    return seen


def test_an_error_keeps_the_items_before_it_and_loses_none_after_it():
    pipe = IterableWrapper(Opaque(list(range(8)))).map(failing_on(frozenset({3})))
    batches = pipe.batch(5)
    it = iter(batches)
    with pytest.raises(Bad, match="bad item 3") as info:
        next(it)
    assert "on the item at position 3" in info.value.__notes__[0]
    assert next(it) == [0, 1, 2, 4, 5]
    assert next(it) == [6, 7]


def test_a_user_function_raising_stopiteration_is_an_error_not_the_end():
    def stop(x):
        raise StopIteration

    with pytest.raises(RuntimeError, match="must not raise it"):
        list(IterableWrapper([1, 2]).map(stop).batch(2))


def test_a_block_overriding_async_next_is_not_fused():
    calls = []

    class Counted(Mapper):
        def async_next(self):
            item = super().async_next()
            calls.append(item)  # once per item it passes on
            return item

    pipe = Counted(IterableWrapper(list(range(10))), lambda x: x + 1).map(str).batch(4)
    assert list(pipe) == [["1", "2", "3", "4"], ["5", "6", "7", "8"], ["9", "10"]]
    assert calls == list(range(1, 11))


class Arrays(IterDataPipe):
    """A block read one item at a time (not fused): yields NumPy arrays."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield np.full(3, i)


def test_a_run_pulls_arrays_from_an_unfused_block_without_comparing_them():
    # Reading a block with ``iter(async_next, sentinel)`` compared every array
    # with the sentinel: an elementwise ``==`` whose truth value raises.
    batches = list(Arrays(5).map(lambda a: a * 2).batch(2))
    assert [[int(a[0]) for a in batch] for batch in batches] == [[0, 2], [4, 6], [8]]
    assert [len(batch) for batch in list(Arrays(5).batch(2))] == [2, 2, 1]


class SlowlyReady(MapDataPipe):
    """Index ``i`` is not available the first ``late[i]`` times it is asked for."""

    def __init__(self, n: int, late: dict[int, int]) -> None:
        self.n, self.late = n, dict(late)

    def async_get(self, index: int) -> int:
        if self.late.get(index, 0):
            self.late[index] -= 1
            raise NotAvailable
        return index

    def __len__(self) -> int:
        return self.n


def test_not_available_mid_run_returns_what_the_run_has_and_loses_nothing():
    pipe = SlowlyReady(10, {3: 2}).to_iter().map(lambda x: x * 10)
    seed_pipeline(pipe, 0)
    reader, out = RunReader(pipe), []
    reader.extend(out, 8)
    assert out == [0, 10, 20]
    with pytest.raises(NotAvailable):
        reader.extend(out, 8)  # still not ready: nothing appended
    reader.extend(out, 8)
    assert out == [0, 10, 20, 30, 40, 50, 60, 70, 80, 90]
    with pytest.raises(StopIteration):
        reader.extend(out, 8)


@pytest.mark.timeout(10)
def test_the_sharding_root_reads_only_its_positions_of_an_indexable_source():
    # a full pass over 3 * 10**12 positions would never end
    pipe = IterableWrapper(range(3 * 10**12)).sharding_filter()
    pipe.sharding_settings(10**12, 5)
    assert list(pipe.map(lambda x: x + 1).batch(2)) == [[6, 10**12 + 6], [2 * 10**12 + 6]]
    assert list(pipe) == [5, 10**12 + 5, 2 * 10**12 + 5]


@pytest.mark.timeout(10)
def test_resume_at_is_immediate_on_an_indexable_source():
    pipe = IterableWrapper(range(10**15)).sharding_filter()
    pipe.sharding_settings(2, 1)
    it = iter(pipe)
    pipe.resume_at(10**15 - 4)
    assert list(it) == [10**15 - 3, 10**15 - 1]


def test_positions_and_draws_of_a_sharded_indexable_source_are_the_global_ones():
    def make(source):
        pipe = IterableWrapper(source).sharding_filter()
        pipe.sharding_settings(3, 2)
        pipe.set_shard_group_size(2)
        return pipe.map(draw).batch(3)

    a, b = make(list(range(20))), make(Opaque(list(range(20))))
    for pipe in (a, b):
        seed_pipeline(pipe, 7)
    assert list(a) == list(b)
    assert [x for batch in list(a) for x, _ in batch] == [4, 5, 10, 11, 16, 17]


def test_threads_share_the_sequences_a_source_only_reads():
    from pipeloom.datapipes.runtime import read_only_data
    from pipeloom.graph import copy

    class MyList(list):
        pass

    data = list(range(100))
    pipe = IterableWrapper(data).sharding_filter().map(str).batch(4)
    assert read_only_data(pipe) == [data]
    twin = copy(pipe, share=read_only_data(pipe))
    assert twin.source.source.source.iterable is data
    assert list(twin) == list(pipe)
    assert copy(pipe).source.source.source.iterable is not data
    # only built-in containers: a subclass or an iterator may change as it is read
    assert read_only_data(IterableWrapper(MyList(data)).batch(2)) == []
    assert read_only_data(IterableWrapper(iter(data)).batch(2)) == []
    assert read_only_data(SequenceWrapper(data).to_iter()) == [data]
