"""Whole-pipeline operations: walking, seeding, epochs, declared inputs, state."""

from __future__ import annotations

import pytest

from pipeloom.datapipes import (
    IterableWrapper,
    IterDataPipe,
    item_rng,
    item_seed,
    load_pipeline_state_dict,
    pipeline_state_dict,
    seed_pipeline,
    set_pipeline_epoch,
)
from pipeloom.errors import StateError
from pipeloom.graph import upstream
from tests.datapipes.helpers import Flaky, OldStyleDouble


class Join(IterDataPipe):
    inputs = ("datapipes",)

    def __init__(self, *datapipes):
        self.datapipes = datapipes

    def __iter__(self):
        for pipe in self.datapipes:
            yield from pipe


def test_upstream_blocks_lists_shared_blocks_once_consumers_first():
    source = IterableWrapper([1])
    left, right = OldStyleDouble(source), OldStyleDouble(source)
    out = Join(left, right)
    assert upstream(out) == [out, right, left, source] or upstream(out) == [
        out,
        left,
        right,
        source,
    ]
    blocks = upstream(out)
    assert blocks.index(source) > blocks.index(left) and blocks.index(source) > blocks.index(right)


def test_cycles_are_rejected_with_the_path():
    a = OldStyleDouble(IterableWrapper([1]))
    b = OldStyleDouble(a)
    a.source = b
    with pytest.raises(ValueError, match="cycle: .*OldStyleDouble -> OldStyleDouble.*DAG"):
        upstream(b)


def test_upstream_blocks_rejects_non_blocks():
    with pytest.raises(TypeError, match="wrap plain iterables with IterableWrapper"):
        upstream([1, 2])  # type: ignore[arg-type]


def random_pipe():
    return IterableWrapper(range(5)).map(lambda x: int(item_rng().integers(1000)))


def test_item_rng_depends_only_on_seed_epoch_and_position():
    pipe = random_pipe()
    seed_pipeline(pipe, 3)
    first = list(pipe)
    second = list(pipe)
    assert first == second
    set_pipeline_epoch(pipe, 1)
    assert list(pipe) != first
    seed_pipeline(pipe, 4)
    set_pipeline_epoch(pipe, 0)
    assert list(pipe) != first
    fresh = random_pipe()
    seed_pipeline(fresh, 3)
    assert list(fresh) == first


def test_item_seed_outside_a_pipeline_explains_itself():
    import threading

    errors = []

    def call():
        try:
            item_seed()
        except RuntimeError as error:
            errors.append(str(error))

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(5)
    assert errors and "outside a pipeline" in errors[0]


def test_epoch_must_be_a_non_negative_int():
    with pytest.raises(ValueError, match="epoch must be an int >= 0, got -1"):
        set_pipeline_epoch(IterableWrapper([1]), -1)


def test_seed_must_be_an_int():
    with pytest.raises(TypeError, match="seed must be an int or None, got str"):
        seed_pipeline(IterableWrapper([1]), "7")  # type: ignore[arg-type]


def test_state_of_another_pipeline_shape_names_the_mismatching_block():
    state = pipeline_state_dict(IterableWrapper([1]))
    with pytest.raises(StateError, match="block #0 is Flaky .* saved from a IterableWrapper"):
        load_pipeline_state_dict(Flaky([1]), state)
    with pytest.raises(StateError, match="the state has 1 blocks but the pipeline has 2"):
        load_pipeline_state_dict(OldStyleDouble(IterableWrapper([1])), state)


def test_state_of_a_block_without_state_support_names_the_block():
    with pytest.raises(StateError, match="OldStyleDouble does not implement state_dict"):
        pipeline_state_dict(OldStyleDouble(IterableWrapper([1])))


def test_state_with_wrong_version_is_rejected():
    with pytest.raises(StateError, match="version 1"):
        load_pipeline_state_dict(IterableWrapper([1]), {"version": 99})
