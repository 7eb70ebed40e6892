"""Random pipelines built from core blocks, as Hypothesis strategies.

A pipeline is a recipe (a tuple of step names) turned into blocks by
:func:`build`, so every loader under test gets a fresh pipeline. Step
functions live at module level so worker processes can import them.
"""

from __future__ import annotations

from hypothesis import strategies as st

from pipeloom.datapipes import IterableWrapper, IterDataPipe, item_rng

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


# -- richer pipelines: tar shards, webdataset, custom blocks (#13) ----------------------
#
# A rich recipe is ``(source, size, per_item, tail)``. Sources: ``range`` (a range and
# sharding_filter), ``tar`` (in-memory tar shards, sharded, read member by member),
# ``webdataset`` (the same shards grouped into samples), ``custom_shardable`` (a
# user-defined sharding point with a plain __iter__, no inputs declared) and
# ``custom_source`` (a user-defined source declaring its inputs, then sharding_filter).
# Every item becomes an int, so the per-item and tail steps apply to any source.

RICH_SOURCES = ("range", "tar", "webdataset", "custom_shardable", "custom_source")
RICH_PER_ITEM = ("jitter", "drop_every_third", "twice", "unbatch_pairs", "square")
RICH_TAIL = ("shuffle_small", "batch_then_unbatch", "custom_twice", "jitter", "batch")


def tar_shards(size):
    """``(name, bytes)`` of 3 tar shards holding samples ``0..size-1`` (two members each)."""
    import io
    import tarfile

    shards = []
    for shard in range(3):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for number in range(shard, size, 3):
                for ext in ("num", "txt"):
                    data = str(number).encode()
                    info = tarfile.TarInfo(f"s{number:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        shards.append((f"shard-{shard}.tar", buffer.getvalue()))
    return shards


def member_number(member):
    return int(member[1]) * 2 + member[0].endswith(".txt")


def sample_number(sample):
    return int(sample["num"])


class CustomShardable(IterDataPipe):
    """A sharding point defined as docs/write_your_own_block.md shows: no inputs, no stamps."""

    def __init__(self, size):
        self.size, self.total, self.index = size, 1, 0

    def is_shardable(self):
        return True

    def sharding_settings(self, total, index):
        self.total, self.index = total, index

    def __iter__(self):
        yield from range(self.index, self.size, self.total)

    def state_dict(self):
        return {}


class CustomSource(IterDataPipe):
    """A source with a declared (empty) input list and its own checkpoint."""

    inputs = ()

    def __init__(self, size):
        self.size, self.next = size, 0

    def reset(self):
        self.next = 0

    def async_next(self):
        if self.next >= self.size:
            raise StopIteration
        self.next += 1
        return self.next - 1

    def state_dict(self):
        return {"next": self.next}

    def load_state_dict(self, state):
        self.next = state["next"]


class CustomTwice(IterDataPipe):
    """A torchdata-style block (no inputs declared) yielding each item twice."""

    def __init__(self, source):
        self.source = source
        self.pending = []

    def reset(self):
        self.pending = []

    def async_next(self):
        if not self.pending:
            self.pending = [self.source.async_next()] * 2
        return self.pending.pop()

    def state_dict(self):
        return {"pending": list(self.pending)}

    def load_state_dict(self, state):
        self.pending = list(state["pending"])


def pair(x):
    return [x, x]


def rich_source(kind, size):
    if kind == "range":
        return IterableWrapper(range(size)).sharding_filter()
    if kind == "custom_shardable":
        return CustomShardable(size)
    if kind == "custom_source":
        return CustomSource(size).sharding_filter()
    shards = IterableWrapper(tar_shards(size)).sharding_filter().load_from_tar()
    if kind == "tar":
        return shards.map(member_number)
    return shards.webdataset().map(sample_number)


def apply_rich(pipe, step):
    if step == "unbatch_pairs":
        return pipe.map(pair).unbatch()
    if step == "custom_twice":
        return CustomTwice(pipe)
    return apply(pipe, step)


def build_rich(recipe):
    source, size, per_item, tail = recipe
    pipe = rich_source(source, size)
    for step in (*per_item, *tail):
        pipe = apply_rich(pipe, step)
    return pipe


rich_recipes = st.tuples(
    st.sampled_from(RICH_SOURCES),
    st.integers(0, 20),
    st.lists(st.sampled_from(RICH_PER_ITEM), max_size=2).map(tuple),
    st.lists(st.sampled_from(RICH_TAIL), max_size=2).map(tuple),
)


def rich_batched(recipe):
    """``recipe`` with a batch right after the per-item steps (what chunked needs)."""
    source, size, per_item, tail = recipe
    return source, size, per_item, ("batch", *tail)
