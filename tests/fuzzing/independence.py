"""Independent randomness: no two items of a random pipeline draw the same ``item_rng()`` numbers.

A block that passes several outputs on from one upstream position (``flatmap``,
``map_batches``, tar members, ``repeat``), a cache or snapshot replaying items
of several sources, a source whose own code drew: each once gave two items the
same stamp, so a random augmentation after them was the same for both. The
services are compared with each other by :mod:`tests.fuzzing.resume`; this
checks what they all agree on, in-process: :func:`duplicated_draws` runs a
random recipe for two epochs with a draw after its last block and returns the
draws that came more than once.

Run many seeds with ``python -m tests.fuzzing.independence --seed 0 --count 1000``;
``--modes stamps,snapshots`` widens the recipes as the resume fuzzer's modes do
(fan-out blocks followed by draws; each cache step a ``snapshot`` on disk, which
the first epoch writes and the second replays).
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import sys
import tempfile
import warnings
from typing import Any

from pipeloom import DataLoader
from pipeloom.datapipes import item_rng, item_stamp
from pipeloom.reading_service import InProcessReadingService

from .recipes import build, random_recipe, write_files

EPOCHS = 2
MODES = ("stamps", "snapshots")


def probe(item: Any) -> tuple[int, Any]:
    """The item's first draw after the pipeline, and its key (to say which items collide)."""
    return int(item_rng().integers(1 << 62)), item_stamp()[2]


def duplicated_draws(
    seed: int, root: str, modes: frozenset[str] = frozenset()
) -> tuple[list[Any], dict[str, Any]] | None:
    """The keys of items whose draw repeats another's, and the recipe; None if it cannot run.

    ``modes``: some of :data:`MODES` (snapshots are kept in ``root``/snapshots, per seed).
    """
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown modes {sorted(unknown)}; expected some of {MODES}")
    recipe = random_recipe(random.Random(seed), stamps="stamps" in modes)
    if "snapshots" in modes:
        recipe["snapshots"] = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a recipe's own warnings are not the point here
            shutil.rmtree(os.path.join(root, "snapshots"), ignore_errors=True)  # another seed's
            pipe = build(recipe, root).map(probe)
            with DataLoader(pipe, reading_service=InProcessReadingService(), seed=seed) as loader:
                drawn = [pair for _ in range(EPOCHS) for pair in loader]
    except Exception:  # a recipe the pipeline refuses (the resume fuzzer checks those)
        return None
    counts = collections.Counter(value for value, _ in drawn)
    return [key for value, key in drawn if counts[value] > 1], recipe


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--modes", default="", help=f"comma separated, some of {', '.join(MODES)}")
    args = parser.parse_args()
    modes = frozenset(filter(None, args.modes.split(",")))
    failed, ran = [], 0
    with tempfile.TemporaryDirectory() as root:
        write_files(root, 50)
        for seed in range(args.seed, args.seed + args.count):
            found = duplicated_draws(seed, root, modes)
            ran += found is not None
            if found and found[0]:
                failed.append(seed)
                print(f"seed={seed} same draws for keys {found[0][:6]} | recipe={found[1]}")
    print(f"{args.count} recipes from seed {args.seed} ({args.modes}), {ran} ran: failed {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
