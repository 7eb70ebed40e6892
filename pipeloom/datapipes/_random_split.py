"""``random_split``: split a stream at random into named parts of given sizes."""

from __future__ import annotations

import random
from collections.abc import Hashable, Mapping
from typing import Any

from ._base import IterDataPipe

__all__ = ["SplitPart", "random_split"]


def random_split(
    source: IterDataPipe,
    weights: Mapping[Hashable, float],
    seed: int,
    total_length: int | None = None,
    target: Hashable | None = None,
) -> list[IterDataPipe] | IterDataPipe:
    """Split ``source`` at random into parts named by ``weights``' keys.

    Each of the ``total_length`` items goes to one part, drawn with the
    part's remaining share of the items, so the parts get sizes in the
    ratio of ``weights`` (exactly, when the weights scale to whole numbers
    of items). The split depends only on ``seed``: it is the same in every
    epoch, every loader and every reading service, and for the same
    ``seed`` the same as torchdata 0.9's. Returns one block per key, in
    ``weights``' order, or only the ``target`` part.

    Each part reads the whole source and keeps its own items, so read the
    parts one after the other (e.g. in separate loaders); to read several
    in one pipeline, ``fork()`` the source first (parts over one unforked
    source in one pipeline are refused: each would see only some items).

    Args:
        source: the stream to split.
        weights: part name -> relative size (> 0).
        seed: the split's seed (an int: a split must not change between runs).
        total_length: the number of items (default ``len(source)``).
        target: return only this part.

    Raises:
        ValueError: bad weights, a ``target`` not in ``weights``, or (while
            iterating) a source longer than ``total_length``.
        TypeError: no ``total_length`` and ``source`` has no length; a
            ``seed`` that is not an int.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> train, valid = IterableWrapper(range(10)).random_split(
        ...     total_length=10, weights={"train": 0.5, "valid": 0.5}, seed=0)
        >>> list(train), list(valid)
        ([2, 3, 5, 7, 8], [0, 1, 4, 6, 9])
    """
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError(
            f"weights must be a non-empty dict of part name -> relative size, got {weights!r}; "
            f"e.g. weights={{'train': 0.8, 'valid': 0.2}}"
        )
    for name, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise ValueError(f"the weight of part {name!r} must be a number > 0, got {weight!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(
            f"seed must be an int, got {seed!r}: a split must be the same in every run, "
            f"epoch and loader, or training data leaks into validation"
        )
    if total_length is None:
        try:
            total_length = len(source)
        except TypeError:
            raise TypeError(
                f"random_split() needs total_length: the source {source!r} has no length"
            ) from None
    if isinstance(total_length, bool) or not isinstance(total_length, int) or total_length < 0:
        raise ValueError(f"total_length must be an int >= 0, got {total_length!r}")
    if target is not None and target not in weights:
        raise ValueError(f"target={target!r} is not one of the parts {list(weights)}")
    shares = dict(weights)
    if target is not None:
        return SplitPart(source, shares, seed, total_length, target)
    return [SplitPart(source, shares, seed, total_length, name) for name in shares]


class _Draws:
    """The sequence of part names, one per item: the split itself."""

    def __init__(self, weights: dict[Hashable, float], seed: int, total_length: int) -> None:
        self.names = list(weights)
        self.start = _scaled([weights[n] for n in self.names], total_length)
        self.seed = seed
        self.total_length = total_length
        self.restart()

    def restart(self) -> None:
        self.rng = random.Random(self.seed)
        self.shares = list(self.start)
        self.left = self.total_length
        self.count = 0

    def next(self) -> Hashable:
        if self.count >= self.total_length:
            raise ValueError(
                f"random_split(): the source has more than total_length={self.total_length} "
                f"items; pass the right total_length"
            )
        self.count += 1
        name = self.rng.choices(self.names, self.shares)[0]
        index = self.names.index(name)
        self.shares[index] -= 1
        self.left -= 1
        if self.shares[index] < 0:  # the part is full: rescale the others to what is left
            self.shares[index] = 0
            self.shares = _scaled(self.shares, self.left)
        return name


def _scaled(weights: list[float], total: int) -> list[float]:
    whole = sum(weights)
    if whole <= 0:  # every part is full (the last item was drawn, or float drift): share evenly
        return [float(total) / len(weights)] * len(weights)
    return [float(w) * total / whole for w in weights]


class SplitPart(IterDataPipe):
    """One part of :func:`random_split`: the items drawn for ``target``."""

    inputs = ("source",)
    at_most_one = True

    def __init__(
        self,
        source: IterDataPipe,
        weights: dict[Hashable, float],
        seed: int,
        total_length: int,
        target: Hashable,
    ) -> None:
        self.source = source
        self.weights = weights
        self.seed = seed
        self.total_length = total_length
        self.target = target
        self._draws = _Draws(weights, seed, total_length)

    def reset(self) -> None:
        self._draws.restart()

    def async_next(self) -> Any:
        draws = self._draws
        while True:
            item = self.source.async_next()
            if draws.next() == self.target:
                return item

    def __len__(self) -> int:
        sizes = _scaled([self.weights[n] for n in self.weights], self.total_length)
        if not all(float(size).is_integer() for size in sizes) or sum(sizes) != self.total_length:
            raise TypeError(
                "the parts' lengths are not known in advance: the weights do not scale to whole "
                f"numbers of the {self.total_length} items; give weights that do (e.g. "
                "{'train': 8, 'valid': 2} for 10 items), or declare a length with .set_length(n)"
            )
        return int(sizes[list(self.weights).index(self.target)])

    def state_dict(self) -> dict[str, Any]:
        return {"draws": self._draws.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        draws = self._draws
        draws.restart()
        for _ in range(int(state["draws"])):  # replay: the split is a function of the seed
            draws.next()

    def __repr__(self) -> str:
        return (
            f"SplitPart(target={self.target!r}, weights={self.weights!r}, seed={self.seed}, "
            f"total_length={self.total_length})"
        )
