"""Random pipelines for the resume fuzzer: a recipe (plain data) and its build.

A recipe is a dict of plain values drawn from a ``random.Random``, so an
example is printed, repeated and minimised by hand; :func:`build` turns it
into fresh blocks over files under a root folder that :func:`write_files`
fills. Every step function lives at module level (worker processes import
them) and every item folds to an int with :func:`num`, so any step applies
after any other.
"""

from __future__ import annotations

import io
import os
import random
import tarfile
from typing import Any

import torch

from pipeloom.datapipes import (
    FileLister,
    IterableWrapper,
    IterDataPipe,
    SequenceWrapper,
    item_rng,
)
from tests.datapipes.helpers import Twice

MOD = 1_000_000_007
SOURCES = (
    "range",
    "list",
    "sequence",
    "files",
    "lines",
    "tar",
    "webdataset",
    "torch_map",
    "torch_iter",
    "generator",
    "generator_no_state",
)
# Steps before the sharding point run on every copy of the source (or in the main process).
PREFIX_STEPS = ("shuffle", "plus", "jitter", "keep", "pairs", "concat_more", "mux", "cycle")
# Steps after which items that arrive in another order are still the same items.
ORDER_FREE = (
    "plus",
    "jitter",
    "keep",
    "pairs",
    "rng_pairs",
    "prefetch",
    "threadpool_map",
    "stamped_twice",
)
RANDOM = (
    "shuffle",
    "jitter",
    "rng_pairs",
    "mux",
    "cycle",
    "bucketbatch",
    "batch_shuffle",
    "shuffled_flatmap",
)  # steps that draw random numbers (threadpool_map draws only with "jitter")
STEPS = (
    "shuffle",
    "plus",
    "jitter",
    "keep",
    "pairs",
    "rng_pairs",
    "batch_unbatch",
    "header",
    "fork_zip",
    "demux_concat",
    "demux_zip",
    "prefetch",
    "threadpool_map",
    "groupby",
    "bucketbatch",
    "enumerate",
    "batch",
    "batch_collate",
    "repeat",
    "batch_shuffle",
    "shuffled_flatmap",
    "map_batches",
    "in_memory_cache",
)
# Drawn too in the "stamps" mode, where every block that makes several outputs of
# one input (and the webdataset grouping) is followed by an item_rng() draw.
STAMP_STEPS = ("stamped_twice", "pairs", "batch_unbatch", "shuffled_flatmap")
FANOUT_STEPS = ("pairs", "batch_unbatch", "shuffled_flatmap", "stamped_twice")


# -- item functions ------------------------------------------------------------------
def num(x: Any) -> int:
    """Fold any item the steps make into an int (order-sensitive)."""
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, int):
        return x % MOD
    if isinstance(x, torch.Tensor):
        return num(x.tolist())
    if isinstance(x, (bytes, str)):
        text = x.decode() if isinstance(x, bytes) else x
        digits = "".join(c for c in os.path.basename(text) if c.isdigit())
        return int(digits) % MOD if digits else len(text)
    if isinstance(x, dict):
        return num([num(x[k]) for k in sorted(x)])
    if isinstance(x, (list, tuple)):
        total = 7
        for value in x:
            total = (total * 31 + num(value)) % MOD
        return total
    raise TypeError(f"the fuzzer cannot fold a {type(x).__name__}: {x!r}")


def plus(x):
    return num(x) + 1


def jitter(x):
    return (num(x) * 1000 + int(item_rng().integers(1000))) % MOD


def keep(x):
    return num(x) % 3 != 0


def pairs(x):
    return [num(x), num(x) + 1]


def rng_pairs(x):
    return [jitter(x), jitter(x)]


def doubled_run(items):
    return [num(x) * 2 for x in items]


def parity(x):
    return num(x) % 2


def mod3(x):
    return num(x) % 3


def fold(x):
    return num(x)


def sort_by_num(batch):
    return sorted(batch, key=num)


def member_number(member):
    return num(member[0]) * 2 + int(member[1].decode()) % 2


def sample_number(sample):
    return int(sample["num"].decode())


def file_number(path):
    return num(path)


def line_number(pair):
    return num(pair[0]) * 100 + int(pair[1].strip())


# -- user sources -------------------------------------------------------------------
class TorchMap(torch.utils.data.Dataset):
    """A map-style torch dataset: item i is 3 * i."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        if not 0 <= index < self.size:
            raise IndexError(index)
        return 3 * index


class TorchIter(torch.utils.data.IterableDataset):
    """An iterable torch dataset over range(size)."""

    def __init__(self, size):
        self.size = size

    def __iter__(self):
        return iter(range(self.size))


class GeneratorSource(IterDataPipe):
    """A user's generator source drawing from item_rng(), saving its position."""

    def __init__(self, size):
        self.size, self.next = size, 0

    def reset(self):
        self.next = 0

    def __iter__(self):
        while self.next < self.size:
            self.next += 1
            yield (self.next - 1) * 1000 + int(item_rng().integers(1000))

    def state_dict(self):
        return {"next": self.next}

    def load_state_dict(self, state):
        self.next = state["next"]


class GeneratorSourceNoState(IterDataPipe):
    """A user's generator source that saves nothing (a resume needs replay)."""

    def __init__(self, size):
        self.size = size

    def __iter__(self):
        for index in range(self.size):
            yield index * 1000 + int(item_rng().integers(1000))


# -- files --------------------------------------------------------------------------
def write_files(root: str, size: int) -> None:
    """Text files ``f0000.txt``... (two lines each) and 3 tar shards of samples 0..size-1."""
    os.makedirs(os.path.join(root, "txt"), exist_ok=True)
    os.makedirs(os.path.join(root, "tar"), exist_ok=True)
    for number in range(size):
        with open(os.path.join(root, "txt", f"f{number:04d}.txt"), "w") as file:
            file.write(f"{number}\n{number + 50}\n")
    for shard in range(3):
        with tarfile.open(os.path.join(root, "tar", f"shard{shard}.tar"), "w") as tar:
            for number in range(shard, size, 3):
                for ext in ("num", "txt"):
                    data = str(number + (ext == "txt")).encode()
                    info = tarfile.TarInfo(f"s{number:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


# -- recipes ------------------------------------------------------------------------
def random_recipe(rng: random.Random, stamps: bool = False) -> dict[str, Any]:
    """A random pipeline: a source, steps before and after its sharding point, a tail.

    ``stamps``: draw the steps of :data:`STAMP_STEPS` often too, and draw from
    ``item_rng()`` after every block that makes several outputs of one input.
    """
    size = rng.choice([0, 1, 2, 3, 5, 8, 13, 20, 31, 50])
    source = rng.choice(SOURCES)
    prefix = [_step(rng, rng.choice(PREFIX_STEPS)) for _ in range(rng.choice([0, 0, 1, 2]))]
    if source in ("tar", "webdataset", "files", "lines"):
        prefix = [step for step in prefix if step[0] == "shuffle"]  # on the paths
    names = STEPS + STAMP_STEPS * 3 if stamps else STEPS
    per_item = [_step(rng, rng.choice(names)) for _ in range(rng.choice([0, 1, 1, 2, 3]))]
    tail = [_step(rng, rng.choice(STEPS)) for _ in range(rng.choice([0, 1, 2]))]
    batched = rng.random() < 0.3
    if batched:  # economic and chunked need .batch(n) right after the per-item part
        per_item = [s for s in per_item if s[0] in ("plus", "jitter", "threadpool_map")]
        tail = [_step(rng, rng.choice(["batch", "batch_collate"])), *tail]
    after = [step[0] for step in (*per_item, *tail)]
    steps = [step[0] for step in (*prefix, *per_item, *tail)]
    last_cache = max((i for i, name in enumerate(steps) if name == "in_memory_cache"), default=None)
    random_source = source in ("generator", "generator_no_state", "torch_map")  # map shuffle
    recipe = {
        "source": source,
        "size": size,
        "prefix": prefix,
        "sharded": rng.random() < 0.95,
        "per_item": per_item,
        "tail": tail,
        "batched": batched,
        # items in any order give the same multiset: in_order=False may be compared
        "order_free": all(name in ORDER_FREE for name in after),
        # a cache over random blocks replays the first epoch exactly only in-process
        # (docs/caching.md: in workers such a cache reads live, or caches a resumed
        # epoch's draws)
        "cache_over_random": last_cache is not None
        and (random_source or any(map(_draws, (*prefix, *per_item, *tail)[:last_cache]))),
    }
    if stamps:  # (a key the default recipes lack: they print as they always did)
        recipe["fanout_draws"] = True
        fanout = [i for i, name in enumerate(steps) if name in FANOUT_STEPS]
        recipe["cache_over_random"] = (
            recipe["cache_over_random"]
            or (last_cache is not None and any(i < last_cache for i in fanout))
            or (last_cache is not None and source == "webdataset")
        )
    return recipe


def _draws(step: tuple) -> bool:
    return step[0] in RANDOM or step[:2] == ("threadpool_map", "jitter")


def _step(rng: random.Random, name: str) -> tuple:
    if name == "shuffle":
        return (name, rng.choice([1, 3, 10, 1000]))
    if name in ("batch_unbatch", "batch", "batch_collate", "bucketbatch"):
        return (name, rng.choice([1, 2, 3, 4]), rng.random() < 0.3)
    if name == "header":
        return (name, rng.choice([0, 1, 5, 12]))
    if name == "prefetch":
        return (name, rng.choice([1, 2, 10]))
    if name == "threadpool_map":
        return (name, rng.choice(["plus", "jitter"]), rng.choice([1, 2, 4]))
    if name == "groupby":
        return (name, rng.choice([2, 3]), rng.choice([7, 100]))
    if name in ("concat_more", "repeat", "map_batches", "shuffled_flatmap"):
        return (name, rng.choice([2, 3, 7]))
    if name == "mux":
        return (name, rng.choice([3, 11]), rng.choice(["first", "all"]), rng.random() < 0.5)
    if name == "batch_shuffle":
        return (name, rng.choice([2, 3, 5]))  # 7: a full group exists
    return (name,)


def build(recipe: dict[str, Any], root: str) -> IterDataPipe:
    """Fresh blocks for ``recipe`` over the files :func:`write_files` wrote under ``root``."""
    kind, size = recipe["source"], recipe["size"]
    pipe = _source(kind, size, root)
    fanout_draws = recipe.get("fanout_draws", False)
    for step in recipe["prefix"]:
        pipe = apply(pipe, step)
        if fanout_draws and step[0] in FANOUT_STEPS:
            pipe = pipe.map(jitter)
    if recipe["sharded"] or kind in ("tar", "webdataset", "lines"):  # else streams would cross
        pipe = pipe.sharding_filter()
    if kind in ("tar", "webdataset"):
        pipe = pipe.open_files("rb").load_from_tar()
        pipe = pipe.map(member_number) if kind == "tar" else pipe.webdataset().map(sample_number)
    elif kind == "lines":
        pipe = pipe.open_files("r").readlines().map(line_number)
    if fanout_draws and kind == "webdataset":
        pipe = pipe.map(jitter)  # a draw per sample, keyed by the grouped members
    for step in (*recipe["per_item"], *recipe["tail"]):
        if step[0] == "in_memory_cache" and recipe.get("snapshots"):
            # on disk, kept by every loader of the example: the first full epoch writes it
            pipe = pipe.snapshot(os.path.join(root, "snapshots"), allow_random=True)
        else:
            pipe = apply(pipe, step)
        if fanout_draws and step[0] in FANOUT_STEPS:
            pipe = pipe.map(jitter)
    return pipe


def _source(kind: str, size: int, root: str) -> IterDataPipe:
    if kind == "range":
        return IterableWrapper(range(size))
    if kind == "list":
        return IterableWrapper([5 * i for i in range(size)])
    if kind == "sequence":
        return SequenceWrapper([7 * i for i in range(size)]).to_iter()
    if kind == "files":
        return FileLister(os.path.join(root, "txt"), "*.txt").map(file_number)
    if kind == "lines":
        return IterableWrapper([os.path.join(root, "txt")]).list_files("*.txt")
    if kind in ("tar", "webdataset"):
        return FileLister(os.path.join(root, "tar"), "*.tar")
    if kind == "torch_map":
        dataset = SequenceWrapper(TorchMap(size))
        return dataset.shuffle() if size % 2 else dataset.to_iter()  # map-style shuffle: iterable
    if kind == "torch_iter":
        return IterableWrapper(TorchIter(size))
    if kind == "generator":
        return GeneratorSource(size)
    if kind == "generator_no_state":
        return GeneratorSourceNoState(size)
    raise ValueError(f"unknown source {kind!r}")


def apply(pipe: IterDataPipe, step: tuple) -> IterDataPipe:
    """``pipe`` followed by the blocks of one recipe step."""
    name, *args = step
    if name == "shuffle":
        return pipe.shuffle(buffer_size=args[0])
    if name in ("plus", "jitter", "keep", "pairs", "rng_pairs"):
        function = globals()[name]
        if name == "keep":
            return pipe.filter(keep)
        if name in ("pairs", "rng_pairs"):
            return pipe.flatmap(function)
        return pipe.map(function)
    if name == "batch_unbatch":
        return pipe.batch(args[0], drop_last=args[1]).unbatch()
    if name == "header":
        return pipe.header(args[0])
    if name == "fork_zip":
        first, second = pipe.fork(2)
        return first.zip(second.map(plus)).map(fold)
    if name in ("demux_concat", "demux_zip"):
        even, odd = pipe.demux(2, parity, buffer_size=1000)
        return even.concat(odd) if name == "demux_concat" else even.zip(odd).map(fold)
    if name == "prefetch":
        return pipe.prefetch(args[0])
    if name == "threadpool_map":
        return pipe.threadpool_map(globals()[args[0]], max_workers=args[1])
    if name == "groupby":
        return pipe.groupby(mod3, group_size=args[0], buffer_size=args[1]).map(fold)
    if name == "bucketbatch":
        return pipe.bucketbatch(args[0], drop_last=args[1], batch_num=2, sort_key=sort_by_num)
    if name == "enumerate":
        return pipe.enumerate()
    if name == "concat_more":
        return pipe.concat(IterableWrapper(range(500, 500 + 3 * args[0])))
    if name == "mux":
        other = IterableWrapper(range(900, 900 + args[0]))
        weights = [0.6, 0.4] if args[2] else None
        stop = args[1] if weights else "first"
        return pipe.mux(other, weights=weights, stop=stop)
    if name == "cycle":
        return pipe.cycle(2)
    if name == "repeat":
        return pipe.repeat(args[0])
    if name == "batch_shuffle":
        return pipe.batch(args[0]).in_batch_shuffle()
    if name == "shuffled_flatmap":
        return pipe.shuffled_flatmap(pairs, buffer_size=args[0])
    if name == "map_batches":
        return pipe.map_batches(doubled_run, args[0])
    if name == "stamped_twice":
        return Twice(pipe)
    if name == "in_memory_cache":
        return pipe.in_memory_cache(allow_random=True)
    if name == "batch":
        return pipe.batch(args[0], drop_last=args[1])
    if name == "batch_collate":
        return pipe.map(fold).batch(args[0], drop_last=args[1]).collate()
    raise ValueError(f"unknown step {name!r}")
