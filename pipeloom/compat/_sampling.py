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
calls when the epoch ends or before the generator is used or saved again --
and skipped when the generator is the sampler's private one, which nothing
else can see.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from ._plan import PlanEntries

__all__ = ["DrawnEpoch", "draw_base_seed", "draw_epoch", "is_known_sampler"]


@dataclass(frozen=True)
class DrawnEpoch:
    """One epoch of a sampler: its entries, and the draws torch makes after the last one.

    Attributes:
        entries: what iterating the sampler to its end yields.
        settle: makes the generator draws torch makes after the last entry
            (they yield nothing); None when there are none that anyone can see.
    """

    entries: PlanEntries
    settle: Callable[[], None] | None = None


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
    settle = None
    if type(sampler) is SequentialSampler:
        flat = np.arange(len(sampler.data_source), dtype=np.int64)
    else:
        drawn, settle = _draw_random(sampler)
        flat = drawn.numpy()
    if not batching:
        return DrawnEpoch(PlanEntries(flat=flat), settle)
    return DrawnEpoch(_batched(flat, index_sampler.batch_size, index_sampler.drop_last), settle)


def _draw_random(sampler: RandomSampler) -> tuple[torch.Tensor, Callable[[], None] | None]:
    """``RandomSampler.__iter__`` run to the end: its draws as one tensor, and what follows them."""
    n = len(sampler.data_source)
    count = sampler.num_samples
    generator = sampler.generator
    private = generator is None
    if generator is None:  # as torch: one int64 from the global RNG seeds a fresh generator
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        generator = torch.Generator()
        generator.manual_seed(seed)
    parts: list[torch.Tensor] = []
    settle: Callable[[], None] | None = None
    if sampler.replacement:
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
        elif not private:  # torch draws a last permutation and keeps none of it
            settle = _DiscardedPermutation(n, generator)
    drawn = [part for part in parts if part.numel()]  # a copy only when there are several
    if len(drawn) == 1:
        return drawn[0], settle
    return (torch.cat(drawn) if drawn else torch.empty(0, dtype=torch.int64)), settle


class _DiscardedPermutation:
    """``torch.randperm(n, generator)``, drawn only to move ``generator`` on as torch does."""

    def __init__(self, n: int, generator: torch.Generator) -> None:
        self.n, self.generator = n, generator

    def __call__(self) -> None:
        torch.randperm(self.n, generator=self.generator)


def _batched(flat: np.ndarray, batch_size: int, drop_last: bool) -> PlanEntries:
    """``BatchSampler``'s cut of ``flat``: runs of ``batch_size``, the last one short or dropped."""
    count = len(flat) // batch_size if drop_last else -(-len(flat) // batch_size)
    offsets = np.minimum(np.arange(count + 1, dtype=np.int64) * batch_size, len(flat))
    return PlanEntries(flat=flat[: offsets[-1]], offsets=offsets)
