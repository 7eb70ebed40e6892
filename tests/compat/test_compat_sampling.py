"""torch's samplers drawn as arrays give torch's indices and leave every RNG as torch leaves it."""

from __future__ import annotations

import pytest
import torch
import torch.utils.data as tud
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.compat._sampling import draw_epoch, is_known_sampler


@st.composite
def samplers(draw: st.DrawFn):
    """(description, factory of a fresh sampler): the same draws each time it is called."""
    n = draw(st.integers(1, 40))
    kind = draw(st.sampled_from(["sequential", "random", "replacement"]))
    num_samples = draw(st.one_of(st.none(), st.integers(1, 3 * n + 70)))
    seeded = draw(st.booleans())
    seed = draw(st.integers(0, 2**31))
    batch = draw(st.one_of(st.none(), st.tuples(st.integers(1, 9), st.booleans())))

    def make():
        generator = torch.Generator().manual_seed(seed) if seeded else None
        if kind == "sequential":
            sampler = tud.SequentialSampler(range(n))
        else:
            sampler = tud.RandomSampler(
                range(n),
                replacement=kind == "replacement",
                num_samples=num_samples,
                generator=generator,
            )
        return sampler if batch is None else tud.BatchSampler(sampler, *batch)

    return f"{kind}(n={n}, num_samples={num_samples}, seeded={seeded}, batch={batch})", make


def generator_states(sampler):
    inner = getattr(sampler, "sampler", sampler)
    own = getattr(inner, "generator", None)
    return [torch.get_rng_state()] + ([] if own is None else [own.get_state()])


@settings(max_examples=150, deadline=None)
@given(case=samplers())
def test_drawn_entries_and_rng_states_equal_iterating_the_sampler(case):
    name, make = case
    torch.manual_seed(1)
    theirs = make()
    expected = list(theirs)
    expected_states = generator_states(theirs)
    torch.manual_seed(1)
    ours = make()
    assert is_known_sampler(ours)
    drawn = draw_epoch(ours)
    entries = drawn.entries
    assert [entries[i] for i in range(len(entries))] == expected, name
    if drawn.settle is not None:  # the draws torch makes after the last index
        drawn.settle()
    assert all(
        torch.equal(a, b) for a, b in zip(generator_states(ours), expected_states, strict=True)
    )


def test_subclasses_and_other_samplers_are_left_to_their_own_iter():
    class Reversed(tud.SequentialSampler):
        def __iter__(self):
            return iter(range(len(self.data_source) - 1, -1, -1))

    for sampler in (
        Reversed(range(3)),
        tud.BatchSampler(Reversed(range(3)), 2, False),
        tud.SubsetRandomSampler([1, 2]),
    ):
        assert not is_known_sampler(sampler)
        with pytest.raises(TypeError, match="iterate it instead"):
            draw_epoch(sampler)


def test_the_discarded_last_permutation_is_drawn_when_the_epoch_ends():
    """torch moves a user generator on by one more permutation once the epoch is read."""
    from pipeloom.compat import DataLoader

    states = []
    for cls in (tud.DataLoader, DataLoader):
        generator = torch.Generator().manual_seed(5)
        iterator = iter(cls(range(6), batch_size=3, shuffle=True, generator=generator))
        next(iterator)
        next(iterator)
        with pytest.raises(StopIteration):
            next(iterator)
        states.append(generator.get_state())
    assert torch.equal(states[0], states[1])
