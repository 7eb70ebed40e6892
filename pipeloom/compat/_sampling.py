"""torch's own samplers drawn as arrays: the same indices and random draws, no Python lists.

Iterating ``RandomSampler`` (``shuffle=True``) makes torch draw a permutation
tensor and convert it to a list of Python ints, and ``BatchSampler`` then
slices that list into lists: at 10 million items that is seconds and
hundreds of MiB before the first batch. For the samplers whose code we know
-- exactly ``SequentialSampler``, ``RandomSampler`` and a ``BatchSampler``
over one of them, not subclasses -- :func:`draw_epoch` makes the very same
calls on the same generators in the same order, so the permutation and every
RNG's state afterwards are torch's, but keeps the result as one int64 array
that the epoch slices batch by batch.

One of torch's calls yields nothing: when ``num_samples`` is a multiple of the
dataset's length (always, with ``shuffle=True``), ``RandomSampler`` draws one
more permutation at the end of the epoch and keeps none of it. It only moves
the generator on, so it is left to :attr:`DrawnEpoch.settle`, which the loader
calls when the epoch ends or before the generator is used again -- and
skipped when the generator is the sampler's private one, which nothing else
can see. torch draws it when its iterator asks the sampler for output
:attr:`DrawnEpoch.settle_at` (counted from 1): an epoch abandoned before
that (a ``break``; torch's workers ask ``prefetch_factor * num_workers``
outputs ahead) never draws it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from ._plan import PlanEntries
from ._range_entries import RangeEntries

__all__ = [
    "DrawnEpoch",
    "EpochRecipe",
    "draw_base_seed",
    "draw_epoch",
    "is_known_sampler",
    "settled_for_a_state",
]


@dataclass(frozen=True)
class DrawnEpoch:
    """One epoch of a sampler: its entries, and the draws torch makes after the last one.

    Attributes:
        entries: what iterating the sampler to its end yields.
        settle: makes the generator draws torch makes after the last entry
            (they yield nothing); None when there are none that anyone can see.
        settle_at: which request for a sampler output (counted from 1) makes
            them: the one for the last, short batch, else the one after the
            last output.
    """

    entries: PlanEntries | RangeEntries
    settle: Callable[[], None] | None = None
    settle_at: int = 0


@dataclass(frozen=True)
class EpochRecipe:
    """How to draw a known sampler's epoch again: a few numbers and a generator's state.

    A checkpoint keeps this instead of the epoch's indices (about 5 KiB
    instead of 8 bytes per index: 76 MiB at 10 million items); drawing again
    gives the very same entries.

    Example:
        >>> shuffled = RandomSampler(range(5), generator=torch.Generator().manual_seed(0))
        >>> entries = draw_epoch(shuffled).entries
        >>> again = EpochRecipe.from_state(entries.to_state()["recipe"]).draw()
        >>> [again[i] for i in range(5)] == [entries[i] for i in range(5)]
        True
    """

    n: int  # the dataset's length
    num_samples: int
    replacement: bool
    generator_state: torch.Tensor | None  # before the draws; None: sequential
    batch_size: int | None  # None: one index per entry
    drop_last: bool

    def draw(self) -> PlanEntries | RangeEntries:
        """The epoch's entries, as :func:`draw_epoch` drew them."""
        if self.generator_state is None:  # sequential: arithmetic, no array
            return RangeEntries.epoch(self.n, self.batch_size, self.drop_last, recipe=self)
        generator = torch.Generator()
        generator.set_state(self.generator_state)
        flat = _draws(generator, self.n, self.num_samples, self.replacement).numpy()
        if self.batch_size is None:
            return PlanEntries(flat=flat, recipe=self)
        return _batched(flat, self.batch_size, self.drop_last, recipe=self)

    def to_state(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "num_samples": self.num_samples,
            "replacement": self.replacement,
            "generator_state": self.generator_state,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> EpochRecipe:
        """:meth:`to_state`'s value back (``ValueError`` when a field is damaged)."""
        if not isinstance(state, dict):
            raise ValueError("expected a dict")
        numbers = [state.get(name) for name in ("n", "num_samples")]
        batch_size, generator_state = state.get("batch_size"), state.get("generator_state")
        flags = [state.get(name) for name in ("replacement", "drop_last")]
        if not all(type(x) is int and x >= 0 for x in numbers) or not all(
            type(x) is bool for x in flags
        ):
            raise ValueError("n and num_samples must be ints >= 0, replacement and drop_last bools")
        if batch_size is not None and not (type(batch_size) is int and batch_size > 0):
            raise ValueError("batch_size must be None or an int > 0")
        if generator_state is not None:
            if not isinstance(generator_state, torch.Tensor):
                raise ValueError("generator_state must be None or a uint8 tensor")
            try:
                torch.Generator().set_state(generator_state)
            except (RuntimeError, TypeError) as error:
                raise ValueError(f"generator_state is not a generator's state: {error}") from None
        n, num_samples = int(numbers[0]), int(numbers[1])  # type: ignore[arg-type]
        return cls(n, num_samples, bool(flags[0]), generator_state, batch_size, bool(flags[1]))


def draw_base_seed(generator: torch.Generator | None) -> int:
    """torch's ``_base_seed``: one int64 drawn from ``generator`` (or the global RNG)."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def is_known_sampler(index_sampler: Any) -> bool:
    """True when :func:`draw_epoch` reproduces ``index_sampler`` (it draws nothing at ``iter``)."""
    if type(index_sampler) is BatchSampler:
        index_sampler = index_sampler.sampler
    return type(index_sampler) in (SequentialSampler, RandomSampler)


def draw_epoch(index_sampler: Any) -> DrawnEpoch:
    """One full pass of ``index_sampler`` (a sampler :func:`is_known_sampler` accepts).

    Example:
        >>> import torch
        >>> def sampler():
        ...     shuffled = RandomSampler(range(5), generator=torch.Generator().manual_seed(0))
        ...     return BatchSampler(shuffled, batch_size=2, drop_last=False)
        >>> entries = draw_epoch(sampler()).entries
        >>> [entries[i] for i in range(len(entries))] == list(sampler())
        True
    """
    if not is_known_sampler(index_sampler):
        raise TypeError(
            f"draw_epoch() reproduces SequentialSampler, RandomSampler and a BatchSampler "
            f"over one of them, got {type(index_sampler).__name__}; iterate it instead"
        )
    batching = type(index_sampler) is BatchSampler
    sampler = index_sampler.sampler if batching else index_sampler
    batch_size = index_sampler.batch_size if batching else None
    drop_last = bool(index_sampler.drop_last) if batching else False
    n = len(sampler.data_source)
    if type(sampler) is SequentialSampler:
        recipe = EpochRecipe(n, n, False, None, batch_size, drop_last)
        return DrawnEpoch(recipe.draw())
    generator, private = sampler.generator, sampler.generator is None
    if generator is None:  # as torch: one int64 from the global RNG seeds a fresh generator
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        generator = torch.Generator()
        generator.manual_seed(seed)
    count, replacement = sampler.num_samples, bool(sampler.replacement)
    recipe = EpochRecipe(n, count, replacement, generator.get_state(), batch_size, drop_last)
    flat = _draws(generator, n, count, replacement).numpy()
    settle = None
    if not replacement and count % n == 0 and not private:
        settle = _DiscardedPermutation(n, generator)  # torch draws one more, keeps none of it
    if batch_size is None:
        return DrawnEpoch(PlanEntries(flat=flat, recipe=recipe), settle, count + 1)
    entries = _batched(flat, batch_size, drop_last, recipe=recipe)
    short_last = count % batch_size != 0 and not drop_last  # BatchSampler ran out making it
    return DrawnEpoch(entries, settle, len(entries) + (0 if short_last else 1))


def _draws(generator: torch.Generator, n: int, count: int, replacement: bool) -> torch.Tensor:
    """``RandomSampler.__iter__`` run to the end: its draws from ``generator``, as one tensor."""
    parts: list[torch.Tensor] = []
    if replacement:
        for _ in range(count // 32):
            parts.append(torch.randint(high=n, size=(32,), dtype=torch.int64, generator=generator))
        parts.append(
            torch.randint(high=n, size=(count % 32,), dtype=torch.int64, generator=generator)
        )
    else:
        for _ in range(count // n):
            parts.append(torch.randperm(n, generator=generator))
        if count % n:
            parts.append(torch.randperm(n, generator=generator)[: count % n])
    drawn = [part for part in parts if part.numel()]  # a copy only when there are several
    if len(drawn) == 1:
        return drawn[0]
    return torch.cat(drawn) if drawn else torch.empty(0, dtype=torch.int64)


@contextmanager
def settled_for_a_state(
    settle: Callable[[], None] | None, generators: list[torch.Generator]
) -> Iterator[None]:
    """``generators`` as they will be when the epoch ends (``settle`` made), then as they were.

    A state saved mid-epoch holds the generators as the resumed epoch leaves
    them, while this loader's own epoch makes those draws only if torch's would.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> with settled_for_a_state(_DiscardedPermutation(3, g), [g]):
        ...     inside = g.get_state()
        >>> torch.equal(inside, g.get_state())
        False
    """
    states = [g.get_state() for g in generators] if settle is not None else []
    if settle is not None:
        settle()
    try:
        yield
    finally:
        for generator, state in zip(generators, states):
            generator.set_state(state)


class _DiscardedPermutation:
    """``torch.randperm(n, generator)``, drawn only to move ``generator`` on as torch does."""

    def __init__(self, n: int, generator: torch.Generator) -> None:
        self.n, self.generator = n, generator

    def __call__(self) -> None:
        torch.randperm(self.n, generator=self.generator)


def _batched(
    flat: np.ndarray, batch_size: int, drop_last: bool, recipe: EpochRecipe
) -> PlanEntries:
    """``BatchSampler``'s cut of ``flat``: runs of ``batch_size``, the last one short or dropped."""
    count = len(flat) // batch_size if drop_last else -(-len(flat) // batch_size)
    offsets = np.minimum(np.arange(count + 1, dtype=np.int64) * batch_size, len(flat))
    return PlanEntries(flat=flat[: offsets[-1]], offsets=offsets, recipe=recipe)
