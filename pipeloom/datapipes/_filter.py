"""``filter``: keep the items for which a predicate is true."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ._base import IterDataPipe
from ._context import current_position
from ._map import Col, fn_name, make_reader, raise_with_note
from ._runs import DROP, Stage

__all__ = ["Filter"]


class Filter(IterDataPipe):
    """Keep the items for which ``filter_fn`` returns True (functional name: ``filter``).

    Args:
        source: the upstream block.
        filter_fn: the predicate. It must return a ``bool`` (a NumPy bool or a
            one-element bool tensor are accepted too); anything else raises
            ``ValueError``, as in torchdata, so that e.g. a forgotten
            comparison does not silently keep every non-empty item.
        input_col: as in :class:`Mapper`: the predicate gets ``item[input_col]``
            (or several positional arguments for a list of columns); the whole
            item is kept or dropped.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper(range(7)).filter(lambda x: x % 3 == 0))
        [0, 3, 6]
    """

    inputs = ("source",)
    per_item = True
    at_most_one = True

    def __init__(
        self, source: IterDataPipe, filter_fn: Callable[..., Any], input_col: Col = None
    ) -> None:
        self.source = source
        self.filter_fn = filter_fn
        self.input_col = input_col
        self._test = make_reader(filter_fn, input_col, "filter", "filter_fn")

    def async_next(self) -> Any:
        pull = self.source.async_next
        test = self._test
        while True:  # each pass consumes one item: re-entrant across NotAvailable
            item = pull()
            try:
                keep = test(item)
            except Exception as error:
                raise_with_note(error, self, current_position())
            if keep is True:
                return item
            if keep is not False and self._as_bool(keep, item):
                return item

    def _run_stage(self) -> Stage:
        """In a fused run (``_runs.py``): the item, or ``DROP`` when the predicate is false."""
        return Stage(self._keep_or_drop, None, drops=True)

    def _keep_or_drop(self, item: Any) -> Any:
        try:
            keep = self._test(item)
        except Exception as error:
            raise_with_note(error, self, current_position())
        if keep is True:
            return item
        if keep is not False and self._as_bool(keep, item):
            return item
        return DROP

    def _as_bool(self, value: Any, item: Any) -> bool:
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, torch.Tensor) and value.dtype == torch.bool and value.numel() == 1:
            return bool(value)
        raise ValueError(
            f"filter_fn {fn_name(self.filter_fn)} must return a bool, got "
            f"{type(value).__name__} {value!r} for the item at position "
            f"{current_position()}; return an explicit comparison, e.g. "
            f"lambda x: len(x) > 0"
        )

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        col = "" if self.input_col is None else f", input_col={self.input_col!r}"
        return f"Filter(filter_fn={fn_name(self.filter_fn)}{col})"
