"""Headspace: the training loop's best-case step, measured on replayed cached batches.

The first ``cache`` outputs of the loader are kept; afterwards they are
replayed, so the loop's steps run with no loading at all. The mean time
between two ``next()`` calls while replaying is the best case a faster loader
could reach (SPDL calls the gap between it and the real step "headspace").
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator
from typing import Any

from .._validate import check_int

__all__ = ["Headspace", "headspace_of"]

_MEASURED: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


class Headspace(Iterator[Any]):
    """Iterate ``loader``'s first ``cache`` outputs, then replay them for ``replays`` more steps.

    After the loop, ``step_s`` is the mean step time over the replayed outputs,
    and ``loader.stats().headspace_step_s`` reports it. The replayed outputs
    are the same objects again: measure with a training step that does not
    modify its batch in place.

    Example:
        >>> import pipeloom
        >>> from pipeloom.datapipes import IterableWrapper
        >>> with pipeloom.DataLoader(IterableWrapper(range(6)), stats=True) as loader:
        ...     replayed = Headspace(loader, cache=2, replays=4)
        ...     list(replayed)
        ...     replayed.step_s is not None
        [0, 1, 0, 1, 0, 1]
        True
    """

    def __init__(self, loader: Any, *, cache: int, replays: int) -> None:
        self.loader = loader
        self.cache = check_int("cache", cache, minimum=1)
        self.replays = check_int("replays", replays, minimum=1)
        self.step_s: float | None = None
        self._items = iter(loader)
        self._cached: list[Any] = []
        self._replayed = 0
        self._since: float | None = None
        self._spent = 0.0

    def __next__(self) -> Any:
        if len(self._cached) < self.cache:
            try:
                item = next(self._items)
            except StopIteration:
                if not self._cached:
                    raise ValueError("the loader gave no output to cache") from None
                self.cache = len(self._cached)  # a short epoch: replay what there is
                return next(self)
            self._cached.append(item)
            return item
        now = time.perf_counter()
        if self._since is not None:
            self._spent += now - self._since
            self.step_s = self._spent / self._replayed
            _MEASURED[self.loader] = self.step_s
        if self._replayed >= self.replays:
            raise StopIteration
        item = self._cached[self._replayed % self.cache]
        self._replayed += 1
        self._since = time.perf_counter()
        return item


def headspace_of(loader: Any) -> float | None:
    """The best-case step a :class:`Headspace` measured on ``loader`` (None if none did)."""
    return _MEASURED.get(loader)
