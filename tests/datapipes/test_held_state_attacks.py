"""Damaged rank states given to ``load_held_states`` (an elastic resume) are refused.

Every block that holds items (``HoldsItems``) merges the states of several old
ranks; each rank's state is checked as ``load_state_dict`` checks one, so a
missing or damaged field raises ``StateError`` naming the block and the field
(docs/checkpointing.md, promise 5), not a ``KeyError`` or ``TypeError``; as
``load_state_dict`` does with the state alone.
"""

from __future__ import annotations

import copy
import re

import pytest

from pipeloom.datapipes import IterableWrapper, reset_pipeline
from pipeloom.errors import StateError


def _double(item):
    return item * 2


def _twice(item):
    return [item, item]


def _sums(batch):
    return [sum(item) for item in batch]


BLOCKS = {
    "pack": lambda s: s.pack(4, buffer_size=2),
    "bucket_by_length": lambda s: s.bucket_by_length(
        len, num_buckets=2, batch_sizes=3, buffer_size=4
    ),
    "max_token_bucketize": lambda s: s.max_token_bucketize(6, buffer_size=3),
    "bucketbatch": lambda s: s.bucketbatch(2, batch_num=2),
    "concat_then_split": lambda s: s.concat_then_split(4),
    "shuffle": lambda s: s.shuffle(buffer_size=4),
    "shuffled_flatmap": lambda s: s.shuffled_flatmap(_twice, buffer_size=3),
    "prefetch": lambda s: s.prefetch(3),
    "threadpool_map": lambda s: s.threadpool_map(_double, scheduled_tasks=3),
    "map_batches": lambda s: s.map_batches(_sums, 3),
}
ITEMS = [[i % 5 + 1] * (i % 3 + 1) for i in range(20)]


def _damaged(state):
    """(field, damaged state) pairs: the state as a non-dict, each field missing or a str."""
    yield "", 7
    for name in state:
        missing = {key: value for key, value in state.items() if key != name}
        yield name, missing
        yield name, {**state, name: "xyz"}


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_a_damaged_rank_state_is_refused_naming_the_block_and_the_field(name):
    pipe = BLOCKS[name](IterableWrapper(ITEMS))
    next(iter(pipe))  # mid-epoch: the block holds items
    state = pipe.state_dict()
    for field, damaged in _damaged(state):
        block = BLOCKS[name](IterableWrapper([]))
        reset_pipeline(block)
        with pytest.raises(StateError) as caught:  # the damaged state is rank 1's
            block.load_held_states([copy.deepcopy(state), damaged])
        _check_names(caught.value, block, field)
        with pytest.raises(StateError) as caught:  # and alone, as a plain resume
            block.load_state_dict(damaged)
        _check_names(caught.value, block, field)


def _check_names(error, block, field):
    message = str(error)
    assert type(block).__name__ in message, message
    assert not field or re.search(rf"field {field!r}", message), (field, message)
