"""Economic and chunked workers seed NumPy's global RNG per item from the whole seed.

It was seeded with ``seed % 2**32``: items whose 63-bit seeds share their lower
32 bits drew the same NumPy numbers (about 190 pairs of items per ImageNet
epoch got identical augmentations), while ``random`` and torch differed.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.reading_service.workers import rngs
from pipeloom.reading_service.workers.rngs import seed_item_rngs, seed_numpy_global

words = st.integers(0, 2**32 - 1)


def numpy_draws(seed: int) -> list[float]:
    seed_item_rngs(seed)
    return np.random.random(4).tolist()


@settings(max_examples=200, deadline=None)
@given(low=words, high=words, other=words)
def test_seeds_differing_only_in_their_upper_bits_draw_different_numpy_numbers(low, high, other):
    if high == other:
        other ^= 1
    first, second = low | (high & 0x7FFFFFFF) << 32, low | (other & 0x7FFFFFFF) << 32
    if first == second:
        second ^= 1 << 32
    assert numpy_draws(first) != numpy_draws(second)
    assert numpy_draws(first) == numpy_draws(first)  # and the same seed repeats


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**63 - 1))
def test_every_global_rng_repeats_for_its_seed_whatever_was_drawn_before(seed):
    seed_item_rngs(seed)
    expected = (random.random(), np.random.normal(size=3).tolist(), torch.rand(2).tolist())
    np.random.normal()  # leaves a cached Gaussian behind
    seed_item_rngs(seed)
    assert (random.random(), np.random.normal(size=3).tolist(), torch.rand(2).tolist()) == expected


def test_a_seed_under_2_to_the_32_seeds_numpy_as_numpy_does():
    seed_numpy_global(123)
    ours = np.random.random(3).tolist()
    np.random.seed(123)
    assert ours == np.random.random(3).tolist()


def test_without_an_in_place_key_it_seeds_from_both_words(monkeypatch):
    monkeypatch.setattr(rngs._NumpyKey, "view", None)
    monkeypatch.setattr(rngs._NumpyKey, "checked", True)
    assert numpy_draws(7) != numpy_draws(7 + (1 << 32))
    seed_numpy_global(7 + (5 << 32))
    ours = np.random.random(2).tolist()
    np.random.seed([7, 5])
    assert ours == np.random.random(2).tolist()
