"""What one epoch of a recipe holds, computed without pipeloom: a reference of its own.

The resume fuzzer compares every service with the in-process run, so a fault
that in-process shares (an item dropped, doubled or changed by a block itself,
wherever it runs) is invisible there. :func:`expected_items` models the
recipes whose epoch is a fixed multiset of ints whatever the seed: sources
without draws, steps that map, filter, fan out or reorder items one at a time
(``shuffle``, ``keep``, ``pairs``, ``repeat``, ``cycle``, ``fork_zip``, ...),
and returns that multiset, or None for a recipe it does not model (draws,
batches, an order-sensitive step, a step that stops early). Each epoch
in-process must hold exactly these items.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from .recipes import FANOUT_STEPS, MOD

Items = list[int]


def _source(kind: str, size: int) -> Items | None:
    """The source's items (``recipes._source`` over ``recipes.write_files``)."""
    if kind in ("range", "files", "torch_iter", "webdataset"):  # file n, sample n: n
        return list(range(size))
    if kind == "list":
        return [5 * i for i in range(size)]
    if kind == "sequence":
        return [7 * i for i in range(size)]
    if kind == "torch_map":
        return [3 * i for i in range(size)]
    if kind == "tar":  # sample n's members .num (n) and .txt (n + 1): 2n + n % 2, 2n + (n+1) % 2
        return list(range(2 * size))
    if kind == "lines":  # file n's lines n and n + 50
        return [n * 100 + line for n in range(size) for line in (n, n + 50)]
    return None  # a generator draws


def _num(x: int) -> int:
    return x % MOD


def _fold_pair(x: int) -> int:
    """``fold((x, plus(x)))``: ``recipes.num`` of a zipped pair."""
    return ((7 * 31 + _num(x)) * 31 + _num(x) + 1) % MOD


_PER_ITEM: dict[str, Callable[[int], list[int]]] = {
    "plus": lambda x: [_num(x) + 1],
    "keep": lambda x: [x] if _num(x) % 3 != 0 else [],
    "pairs": lambda x: [_num(x), _num(x) + 1],
    "shuffled_flatmap": lambda x: [_num(x), _num(x) + 1],
    "stamped_twice": lambda x: [x, x],
    "map_batches": lambda x: [_num(x) * 2],
    "fork_zip": lambda x: [_fold_pair(x)],
}
_SAME = ("shuffle", "prefetch", "in_memory_cache", "demux_concat")


def _step(items: Items, step: tuple) -> Items | None:
    name, *args = step
    if name in _SAME:
        return items
    if name in _PER_ITEM:
        return [y for x in items for y in _PER_ITEM[name](x)]
    if name == "threadpool_map" and args[0] == "plus":
        return [_num(x) + 1 for x in items]
    if name == "repeat":
        return [x for x in items for _ in range(args[0])]
    if name == "cycle":
        return items * 2
    if name == "concat_more":
        return items + list(range(500, 500 + 3 * args[0]))
    if name == "batch_unbatch" and (not args[1] or len(items) % args[0] == 0):
        return items  # (drop_last drops a partial batch whose items depend on the order)
    if name == "header" and args[0] >= len(items):
        return items
    return None


def expected_items(recipe: dict[str, Any]) -> collections.Counter[Any] | None:
    """The multiset of one epoch's items of ``recipe`` (any epoch), or None if not modelled."""
    if recipe.get("fanout_draws") and recipe["source"] == "webdataset":
        return None  # a draw per sample
    items = _source(recipe["source"], recipe["size"])
    for step in (*recipe["prefix"], *recipe["per_item"], *recipe["tail"]):
        if items is None:
            return None
        if recipe.get("fanout_draws") and step[0] in FANOUT_STEPS:
            return None  # each is followed by a draw
        items = _step(items, step)
    return None if items is None else collections.Counter(items)


def main() -> int:
    """Check many recipes' in-process epochs against the model (fast: no services)."""
    import argparse
    import random
    import tempfile
    import warnings

    from pipeloom import DataLoader

    from .recipes import build, random_recipe, write_files
    from .resume import difference, plain

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--stamps", action="store_true", help="recipes of the stamps mode")
    args = parser.parse_args()
    failed, modelled = [], 0
    for seed in range(args.seed, args.seed + args.count):
        recipe = random_recipe(random.Random(seed), stamps=args.stamps)
        expected = expected_items(recipe)
        if expected is None:
            continue
        modelled += 1
        try:
            with warnings.catch_warnings(), tempfile.TemporaryDirectory() as root:
                warnings.simplefilter("ignore")
                write_files(root, recipe["size"])  # (file sources list every file there)
                with DataLoader(build(recipe, root), seed=seed) as loader:
                    epochs = [[plain(x) for x in loader] for _ in range(2)]
        except Exception as error:  # noqa: BLE001 - a refused recipe is not the point
            print(f"seed={seed} raised {type(error).__name__}: {error} | recipe={recipe}")
            continue
        for got in epochs:
            if collections.Counter(got) != expected:
                failed.append(seed)
                wrong = difference(got, list(expected.elements()))
                print(f"seed={seed} WRONG: {wrong} | recipe={recipe}", flush=True)
                break
    print(f"{args.count} recipes from seed {args.seed}, {modelled} modelled: failed {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
