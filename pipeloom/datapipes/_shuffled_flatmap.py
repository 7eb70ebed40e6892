"""``shuffled_flatmap``: flatmap whose outputs interleave the expansions of several items."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from ._base import IterDataPipe
from ._context import current_stamp, stamp_output
from ._held import HeldShare, HoldsItems, share_of
from ._map import Col, fn_name, make_reader, raise_with_note
from ._state_fields import StateFields


def _identity(item: Any) -> Any:
    return item


__all__ = ["ShuffledFlatMapper"]


class ShuffledFlatMapper(IterDataPipe, HoldsItems):
    """Expand items like ``flatmap``; yield each next element from a random pending item.

    Functional: ``shuffled_flatmap``. Up to ``buffer_size`` items' expansions
    wait in a buffer; each output is the next element of one of them, chosen
    at random (from the block's epoch seed, so runs repeat), and a new item is
    expanded when one runs out. Each element keeps its order within its
    item's expansion and carries that item's stamp. On a resume on another
    number of ranks each new rank takes its share of the old ranks' pending
    expansions (``HoldsItems``) and expands new items once fewer than
    ``buffer_size`` are left.

    Args:
        source: the upstream block.
        fn: item (or ``item[input_col]``) -> iterable; None: the item is one.
        input_col: the column(s) passed to ``fn``, as in ``map``.
        buffer_size: how many items' expansions to interleave.
        seed: this block's own seed (otherwise the pipeline's).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> out = list(IterableWrapper([[1, 2, 3], "ab"]).shuffled_flatmap(buffer_size=2, seed=0))
        >>> sorted(map(str, out)), [x for x in out if x in (1, 2, 3)]
        (['1', '2', '3', 'a', 'b'], [1, 2, 3])
    """

    inputs = ("source",)

    def __init__(
        self,
        source: IterDataPipe,
        fn: Callable[[Any], Any] | None = None,
        input_col: Col = None,
        buffer_size: int = 100,
        *,
        seed: int | None = None,
    ) -> None:
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"buffer_size must be an int >= 1, got {buffer_size!r}")
        self.source = source
        self.fn = fn
        self.input_col = input_col
        self.buffer_size = buffer_size
        self.seed = seed
        self._expand = make_reader(
            _identity if fn is None else fn, input_col, "shuffled_flatmap", "fn"
        )
        self.use_own_seed(seed)
        self.reset()

    def reset(self) -> None:
        # [the item's elements, its stamp, index of its next element, index of elements[0]]
        # (elements[0] is not the item's first element after a resume); elements already
        # given out are replaced by None so that the buffer does not keep them alive.
        self._pending: list[list[Any]] = []
        self._rng: random.Random | None = None
        self._ended = False

    def async_next(self) -> Any:
        pending = self._pending
        while not self._ended and len(pending) < self.buffer_size:
            try:
                item = self.source.async_next()  # NotAvailable keeps the buffer
            except StopIteration:
                self._ended = True
                break
            stamp = current_stamp()
            try:
                elements = list(self._expand(item))
            except Exception as error:
                raise_with_note(error, self, stamp[2])
            if elements:
                pending.append([elements, stamp, 0, 0])
        if not pending:
            raise StopIteration
        if self._rng is None:
            self._rng = random.Random(self.epoch_seed())
        index = self._rng.randrange(len(pending))
        entry = pending[index]
        elements, stamp, output, first = entry
        value = elements[output - first]
        elements[output - first] = None
        entry[2] = output + 1
        if output + 1 - first == len(elements):
            del pending[index]
        stamp_output(stamp, output)  # element j of the item keyed k: key (*k, j)
        return value

    def state_dict(self) -> dict[str, Any]:
        return {
            "pending": [(e[j - first :], s, j) for e, s, j, first in self._pending],
            "rng": None if self._rng is None else self._rng.getstate(),
            "ended": self._ended,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        pending = []
        for entry in fields.list("pending"):
            valid = isinstance(entry, (list, tuple)) and len(entry) in (2, 3)
            if valid:
                output = (*entry, 0)[2]
                valid = isinstance(entry[0], (list, tuple)) and _is_count(output)
            if not valid:
                fields.fail("pending", "(outputs left, stamp, outputs sent) entries", entry)
            stamp = fields.check_stamp("pending", entry[1])
            pending.append([list(entry[0]), stamp, output, output])
        if "rng" not in state:
            fields.list("rng")  # raises: the state has no field 'rng'
        saved = state["rng"]
        if isinstance(saved, list) and len(saved) == 3 and isinstance(saved[1], list):
            saved = (saved[0], tuple(saved[1]), saved[2])  # a state that went through JSON
        self._rng = StateFields(self, {"rng": saved}).rng("rng")
        self._ended = fields.bool("ended")
        self._pending = pending

    def load_held_states(
        self, states: list[dict[str, Any]], share: HeldShare | None = None
    ) -> None:
        """This rank's share of the old ranks' pending expansions (an expansion is one
        unit); past ``buffer_size`` they drain before new items."""
        pending: list[Any] = []
        for state in states:
            self.load_state_dict(state)  # checks the fields
            pending.extend(state["pending"])
        rng = next((s["rng"] for s in states if s.get("rng") is not None), None)
        self.load_state_dict({"pending": share_of(share, pending), "rng": rng, "ended": False})

    def __repr__(self) -> str:
        name = None if self.fn is None else fn_name(self.fn)
        return f"ShuffledFlatMapper(fn={name}, buffer_size={self.buffer_size}, seed={self.seed!r})"


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
