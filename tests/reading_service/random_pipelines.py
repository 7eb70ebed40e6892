"""Random pipelines built from core blocks, as Hypothesis strategies.

A pipeline is a recipe (a tuple of step names) turned into blocks by
:func:`build`, so every loader under test gets a fresh pipeline. Step
functions live at module level so worker processes can import them.
"""

from __future__ import annotations

from hypothesis import strategies as st

from pipeloom.datapipes import IterableWrapper, item_rng

PREFIX = ("shuffle", "plus_one")  # before the sharding point: replicated in workers
PER_ITEM = ("jitter", "drop_every_third", "twice", "square")  # after it: run in workers
TAIL = ("shuffle_small", "batch_then_unbatch", "batch", "enumerate", "jitter", "first_20")


def plus_one(x):
    return x + 1


def jitter(x):
    return (x, int(item_rng().integers(1000)))


def keep(x):
    value = x[0] if isinstance(x, tuple) else x
    return not isinstance(value, int) or value % 3 != 0


def twice(x):
    return [x, x]


def square(x):
    return x * x if isinstance(x, int) else x


def apply(pipe, step):
    return {
        "shuffle": lambda p: p.shuffle(),
        "plus_one": lambda p: p.map(plus_one),
        "jitter": lambda p: p.map(jitter),
        "drop_every_third": lambda p: p.filter(keep),
        "twice": lambda p: p.flatmap(twice),
        "square": lambda p: p.map(square),
        "shuffle_small": lambda p: p.shuffle(buffer_size=5),
        "batch_then_unbatch": lambda p: p.batch(3).unbatch(),
        "batch": lambda p: p.batch(4),
        "enumerate": lambda p: p.enumerate(),
        "first_20": lambda p: p.header(20),
    }[step](pipe)


def build(recipe):
    size, prefix, per_item, tail = recipe
    pipe = IterableWrapper(range(size))
    for step in prefix:
        pipe = apply(pipe, step)
    pipe = pipe.sharding_filter()
    for step in (*per_item, *tail):
        pipe = apply(pipe, step)
    return pipe


recipes = st.tuples(
    st.integers(0, 30),
    st.lists(st.sampled_from(PREFIX), max_size=2).map(tuple),
    st.lists(st.sampled_from(PER_ITEM), max_size=3).map(tuple),
    st.lists(st.sampled_from(TAIL), max_size=2).map(tuple),
)


def batched(recipe, one_to_one: bool):
    """``recipe`` with a batch right after the per-item steps (what economic/chunked need).

    ``one_to_one`` keeps only per-item steps that yield one output per input.
    """
    size, prefix, per_item, tail = recipe
    if one_to_one:
        per_item = tuple(step for step in per_item if step in ("jitter", "square"))
    return size, prefix, per_item, ("batch", *tail)
