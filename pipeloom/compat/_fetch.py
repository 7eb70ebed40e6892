"""Reading a torch dataset exactly as torch's fetchers do (``torch/utils/data/_utils/fetch.py``)."""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import IterDataPipe as TorchIterDataPipe
from torch.utils.data import graph_settings

from ..datapipes import IterDataPipe
from ..datapipes.runtime import current_stamp, derive_seed, restore_stamp
from ._plan import PlanBoard
from ._shared_area import SharedArea

__all__ = ["Fetch", "GetItem", "IterableDatasetSource"]


class Fetch:
    """One sampler output -> one collated batch (or converted item), like ``_MapDatasetFetcher``.

    With ``auto_collation`` the entry is a list of indices, read with
    ``dataset.__getitems__`` when the dataset has one, else item by item.

    Example:
        >>> Fetch(["a", "b", "c"], collate_fn=list, auto_collation=True)([2, 0])
        ['c', 'a']
    """

    def __init__(self, dataset: Any, collate_fn: Callable[[Any], Any], auto_collation: bool):
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.auto_collation = auto_collation

    def __call__(self, entry: Any) -> Any:
        dataset = self.dataset
        try:
            if self.auto_collation:
                if getattr(dataset, "__getitems__", None):
                    data = dataset.__getitems__(entry)
                else:
                    data = [dataset[index] for index in entry]
            else:
                data = dataset[entry]
        except StopIteration as error:
            raise _stop_iteration(f"{type(dataset).__name__}.__getitem__", entry) from error
        try:
            return self.collate_fn(data)
        except StopIteration as error:
            raise _stop_iteration("collate_fn", entry) from error

    def __repr__(self) -> str:
        return f"Fetch({type(self.dataset).__name__})"


def _stop_iteration(where: str, entry: Any) -> RuntimeError:
    """The error for a ``StopIteration`` out of a map-style fetch (torch's would end the epoch)."""
    return RuntimeError(
        f"{where} raised StopIteration while fetching {reprlib.repr(entry)}. torch's "
        f"DataLoader takes it for the end of the epoch and silently drops the batches after it; "
        f"pipeloom.compat.DataLoader raises instead. Raise another exception for a bad "
        f"sample, or let the sampler yield only the indices the dataset has"
    )


class GetItem:
    """``index -> dataset[index]``: the per-item half of :class:`Fetch`.

    Example:
        >>> GetItem("xyz")(1)
        'y'
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __call__(self, index: Any) -> Any:
        try:
            return self.dataset[index]
        except StopIteration as error:
            raise _stop_iteration(f"{type(self.dataset).__name__}.__getitem__", index) from error

    def __repr__(self) -> str:
        return f"GetItem({type(self.dataset).__name__})"


class IterableDatasetSource(IterDataPipe):
    """Read a torch ``IterableDataset`` the way each of torch's workers does.

    Each copy (one per worker) iterates the whole dataset -- the dataset
    shards itself with ``torch.utils.data.get_worker_info()`` or a
    ``worker_init_fn``, as with torch -- and, like ``_IterableDatasetFetcher``,
    groups ``batch_size`` items and collates them (or converts single items
    when ``batch_size`` is None). Worker ``i`` of ``n`` stamps its ``k``-th
    output with position ``k * n + i``, before it reads the output's items (so
    ``item_rng()`` in the dataset's ``__iter__`` draws for that output): the
    merge then interleaves the workers round-robin and skips a finished one,
    which is torch's output order. With a ``board``, a worker first makes (and
    drops) the outputs of an abandoned epoch that torch's worker would still
    have made (the plan's ``catch_up``), then starts the next epoch.

    Example:
        >>> source = IterableDatasetSource(range(5), batch_size=2, collate_fn=list)
        >>> list(source)
        [[0, 1], [2, 3], [4]]
    """

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int | None,
        collate_fn: Callable[[Any], Any],
        drop_last: bool = False,
        board: PlanBoard | None = None,
    ) -> None:
        self.dataset = dataset
        self.board = board
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.total = 1
        self.index = 0
        self._iterator: Any = None
        self._ended = False
        self._count = 0
        self._ran: int | None = None  # the serial of the plan this copy ran last

    def attach(self, area: SharedArea | None, wake_fd: int | None = None) -> None:
        """In a new worker process: read plans from the shared ``area``."""
        if self.board is not None:
            self.board.attach(area, wake_fd)
        self._ran = None  # it ran nothing yet (under fork it is the parent's object)

    def is_shardable(self) -> bool:
        return True

    def sharding_settings(self, total: int, index: int) -> None:
        self.total, self.index = total, index

    def reset(self) -> None:
        if self.board is not None:
            serial, catch_up = self.board.catch_up()
            if catch_up is not None and catch_up.after == self._ran and serial != self._ran:
                self._catch_up(catch_up.outputs)
            self._ran = serial
            if isinstance(self.dataset, TorchIterDataPipe):
                self._set_up_datapipe(self.board.read())
        self._iterator = None
        self._ended = False
        self._count = 0

    def _set_up_datapipe(self, plan: Any) -> None:
        """A torch ``IterDataPipe``: shard it over the workers and seed its shufflers alike.

        torch's loader does both for a datapipe (``apply_sharding`` in each
        worker, ``apply_random_seed`` with a seed shared by the workers at each
        epoch): a ``sharding_filter()`` keeps worker ``i``'s share, and a
        ``shuffle()`` before it draws the same order in every worker, so each
        item comes once. The shared seed is mixed from the epoch's base seed
        (torch draws one more number for it, so the order is not torch's).
        """
        graph_settings.apply_sharding(self.dataset, self.total, self.index)
        shared = torch.Generator()
        shared.manual_seed(derive_seed(plan.base_seed, plan.epoch))
        graph_settings.apply_random_seed(self.dataset, shared)

    def _catch_up(self, outputs: tuple[int, ...]) -> None:
        """Make this worker's outputs of the abandoned epoch up to its count; drop them."""
        if self.index >= len(outputs):
            return
        stamp = current_stamp()
        try:
            while self._count < outputs[self.index]:
                try:
                    self.async_next()
                except StopIteration:
                    return
                except Exception:  # torch's worker sends it, and its _reset drops it
                    self._count += 1  # a failed fetch is one of its tasks too
        finally:
            restore_stamp(stamp)

    def async_next(self) -> Any:
        if self._ended:
            raise StopIteration
        if self._iterator is None:  # here, after worker_init_fn, as torch's fetcher
            self._iterator = iter(self.dataset)
        position = self._count * self.total + self.index
        self._stamp_item(position)  # item_rng() in the dataset's __iter__ draws for it
        if self.batch_size is None:
            try:
                data = next(self._iterator)
            except StopIteration:
                self._ended = True
                raise
        else:
            data = []
            for _ in range(self.batch_size):
                try:
                    data.append(next(self._iterator))
                except StopIteration:
                    self._ended = True
                    break
            if not data or (self.drop_last and len(data) < self.batch_size):
                self._ended = True
                raise StopIteration
        output = self.collate_fn(data)
        self._count += 1
        self._stamp_item(position)  # a new stamp: the draws made while reading start over
        return output

    def state_dict(self) -> dict[str, Any]:
        return {"count": self._count}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_iterator"] = None
        return state

    def __repr__(self) -> str:
        return (
            f"IterableDatasetSource({type(self.dataset).__name__}, "
            f"batch_size={self.batch_size}, drop_last={self.drop_last})"
        )
