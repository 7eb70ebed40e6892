"""In-process epochs hold what a model computed without pipeloom says (tests/fuzzing/model).

The resume fuzzer's reference is the in-process run; this checks that run itself on
the recipes the model covers (sources without draws, steps one item at a time). Run
``python -m tests.fuzzing.model --seed 0 --count 5000`` for thousands of recipes.
"""

from __future__ import annotations

import collections
import random

import pytest

from pipeloom import DataLoader
from tests.fuzzing.model import expected_items
from tests.fuzzing.recipes import build, random_recipe, write_files
from tests.fuzzing.resume import plain

pytestmark = pytest.mark.timeout(120)

SEEDS = range(120)


def test_in_process_epochs_hold_the_modelled_items(tmp_path):
    recipes = [(seed, random_recipe(random.Random(seed))) for seed in SEEDS]
    recipes = [(seed, recipe) for seed, recipe in recipes if expected_items(recipe) is not None]
    assert len(recipes) >= 10, f"only {len(recipes)} of {len(SEEDS)} recipes are modelled"
    for seed, recipe in recipes:
        root = tmp_path / str(seed)
        write_files(str(root), recipe["size"])
        with DataLoader(build(recipe, str(root)), seed=seed) as loader:
            for _ in range(2):
                got = collections.Counter(plain(x) for x in loader)
                assert got == expected_items(recipe), (seed, recipe)


def test_the_model_sees_a_dropped_or_doubled_item():
    recipe = {"source": "range", "size": 5, "prefix": [("shuffle", 3)], "per_item": [("pairs",)]}
    recipe |= {"tail": [("keep",), ("repeat", 2)]}
    expected = expected_items(recipe)
    assert expected is not None
    assert sorted(expected.elements()) == [1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 4, 5, 5]
    assert expected != collections.Counter([1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 4, 5, 5, 5])
