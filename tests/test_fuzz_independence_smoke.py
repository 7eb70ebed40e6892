"""No two items of a random pipeline draw the same item_rng() numbers (tests/fuzzing/independence).

Seeds 6, 13, 49, 81 and 98 found map_batches giving every result of a run its
first item's stamp; run the module itself for thousands of recipes.
"""

from __future__ import annotations

import pytest

from tests.fuzzing.independence import duplicated_draws
from tests.fuzzing.recipes import write_files

pytestmark = pytest.mark.timeout(120)

SEEDS = (*range(40), 49, 81, 98, 133, 144, 192, 195)
WIDE = frozenset({"stamps", "snapshots"})  # fan-out blocks followed by draws; snapshots
# (modes, seed) that found repeated draws: an in_memory_cache over a cycle replayed the
# first epoch's stamp of a batch of both rounds in every epoch
REGRESSIONS = [(frozenset({"stamps"}), 711646)]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("fuzz-files"))
    write_files(path, 50)
    return path


@pytest.mark.parametrize("modes", [frozenset(), WIDE], ids=["default", "stamps,snapshots"])
def test_no_two_items_draw_the_same_numbers(root, modes):
    ran, repeated = 0, {}
    for seed in SEEDS:
        found = duplicated_draws(seed, root, modes)
        if found is None:
            continue
        ran += 1
        if found[0]:
            repeated[seed] = (found[0][:4], found[1])
    assert ran >= len(SEEDS) // 2, f"only {ran} of the recipes could run"
    assert not repeated, repeated


@pytest.mark.parametrize(("modes", "seed"), REGRESSIONS)
def test_a_recipe_that_once_repeated_draws_no_longer_does(root, modes, seed):
    found = duplicated_draws(seed, root, modes)
    assert found is not None, "the recipe no longer runs"
    assert not found[0], found
