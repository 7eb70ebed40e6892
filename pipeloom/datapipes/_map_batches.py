"""``map_batches``: apply a function to runs of items, yield what it returns item by item."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._base import IterDataPipe
from ._context import NO_STAMP, current_stamp, stamp_output
from ._held import HeldShare, HoldsItems, share_of
from ._map import Col, check_callable, fn_name, parse_input_col
from ._state_fields import StateFields

__all__ = ["BatchMapper"]


class BatchMapper(IterDataPipe, HoldsItems):
    """Call ``fn`` on each run of ``batch_size`` items and yield its results one by one.

    Functional: ``map_batches``. For vectorised functions (a tokenizer that
    takes a list of strings). ``fn`` gets a list of items (or of
    ``item[input_col]``; with several columns, a list of lists) and returns
    an iterable, whose length may differ from the batch's. The last batch
    may be shorter. Result ``j`` of a batch is stamped as output ``j`` of the
    batch's first item (key ``(p, j)``, as ``flatmap``'s outputs), so
    ``item_rng()`` after the block draws differently for each result.
    Between two batches the block holds nothing; inside one it holds the
    results not yet passed on, which a resume on another number of ranks
    shares out over the new ranks (``HoldsItems``).

    Args:
        source: the upstream block.
        fn: list of items -> iterable of results.
        batch_size: items per call.
        input_col: ``None`` passes the items; an index/key passes that
            column of each; a list of them passes a list per item.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper(range(5)).map_batches(lambda b: [x + 1 for x in b], 3))
        [1, 2, 3, 4, 5]
        >>> list(IterableWrapper([(1, "a"), (2, "b")]).map_batches(lambda b: b * 2, 2, input_col=1))
        ['a', 'b', 'a', 'b']
    """

    inputs = ("source",)

    def __init__(
        self,
        source: IterDataPipe,
        fn: Callable[[list[Any]], Any],
        batch_size: int,
        input_col: Col = None,
    ) -> None:
        check_callable(fn, "fn", "map_batches", 1)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self._col, self._several = parse_input_col(input_col, "map_batches")
        self.source = source
        self.fn = fn
        self.batch_size = batch_size
        self.input_col = input_col
        self.reset()

    def reset(self) -> None:
        self._batch: list[Any] = []
        self._first_stamp: tuple = NO_STAMP
        self._results: list[Any] = []
        self._given = 0  # results of this batch passed on before _results[0] (a resume)
        self._next = 0
        self._ended = False
        # other ranks' batches (elastic resume), first: (called, results or inputs, stamp,
        # results of it passed on before)
        self._held: list[tuple[bool, list[Any], tuple, int]] = []

    def async_next(self) -> Any:
        while self._next >= len(self._results):
            if self._held:
                called, items, self._first_stamp, self._given = self._held.pop(0)
                self._results, self._next = items if called else self._call(items), 0
                continue
            if self._ended:
                raise StopIteration
            self._fill()  # NotAvailable keeps the partial batch
            batch, self._batch = self._batch, []
            self._results, self._next, self._given = self._call(batch), 0, 0
        index = self._next
        self._next = index + 1
        stamp_output(self._first_stamp, self._given + index)
        return self._results[index]

    def _fill(self) -> None:
        batch, source = self._batch, self.source
        try:
            while len(batch) < self.batch_size:
                batch.append(source.async_next())
                if len(batch) == 1:
                    self._first_stamp = current_stamp()
        except StopIteration:
            self._ended = True
            if not batch:
                raise

    def _call(self, batch: list[Any]) -> list[Any]:
        col = self._col
        if self._several:
            args: list[Any] = [[item[c] for c in col] for item in batch]
        elif col is not None:
            args = [item[col] for item in batch]
        else:
            args = batch
        results = self.fn(args)
        try:
            return list(results)
        except TypeError:
            raise TypeError(
                f"map_batches(): fn {fn_name(self.fn)} must return an iterable of results, got "
                f"{type(results).__name__}"
            ) from None

    def state_dict(self) -> dict[str, Any]:
        results = self._results[self._next :]
        holding = self._batch or results
        state = {
            "batch": list(self._batch),
            # between batches the stamp is not needed: the state is an epoch start's
            "first_stamp": self._first_stamp if holding else NO_STAMP,
            "results": results,
            "given": self._given + self._next if results else 0,
            "ended": self._ended,
        }
        if self._held:
            state["held"] = [
                [c, list(items), stamp, given] for c, items, stamp, given in self._held
            ]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        batch, results = fields.list("batch"), fields.list("results")
        first_stamp, ended = fields.stamp("first_stamp"), fields.bool("ended")
        # the results passed on before: needed to key the rest as the uninterrupted run
        given = fields.int("given") if results else fields.int("given", default=0)
        held = []
        for entry in fields.list("held", default=[]):
            shaped = isinstance(entry, (list, tuple)) and len(entry) == 4
            if not shaped or type(entry[1]) is not list or type(entry[3]) is not int:
                fields.fail("held", "a list of [called, items list, stamp, given]", entry)
            stamp = fields.check_stamp("held", entry[2])
            held.append((bool(entry[0]), list(entry[1]), stamp, entry[3]))
        self.reset()
        self._batch, self._first_stamp, self._ended = batch, first_stamp, ended
        self._results, self._given, self._held = results, given, held

    def load_held_states(
        self, states: list[dict[str, Any]], share: HeldShare | None = None
    ) -> None:
        """This rank's share of the old ranks' results not yet passed on (each result a
        unit, keyed as before) and partial batches (each one unit, called on alone)."""
        held: list[tuple[bool, list[Any], tuple, int]] = []
        for state in states:
            self.load_state_dict(state)  # checks the fields
            entries = list(self._held)
            if self._results:
                entries.append((True, self._results, self._first_stamp, self._given))
            if self._batch:
                entries.append((False, self._batch, self._first_stamp, 0))
            for called, items, stamp, given in entries:
                if not called:  # its results are known only once called: one unit
                    held.append((called, items, stamp, given))
                    continue
                held += [(True, [result], stamp, given + j) for j, result in enumerate(items)]
        self.reset()
        self._held = share_of(share, held)

    def __repr__(self) -> str:
        col = "" if self.input_col is None else f", input_col={self.input_col!r}"
        return f"BatchMapper(fn={fn_name(self.fn)}, batch_size={self.batch_size}{col})"
