"""Distinct item keys for the several outputs a block makes of one input.

Every pull stamps the item it returns, so a block's output made without a pull
finds the thread's stamp as it was before the block ran (or with more
``item_rng()`` draws of the same key, when the block drew between its
outputs). :class:`OutputStamps` stamps such an output as output ``j`` of the
last input pulled (key ``(p, j)``, ``j`` counting from 1; the first output of
an input keeps ``p``), as ``flatmap``, ``unbatch`` and tar members stamp
theirs (:func:`~pipeloom.datapipes._context.stamp_output`), so two crops of
one image get different ``item_rng()`` draws under every reading service and
after a resume (the last input's stamp and ``j`` are saved with the block's
state). One ``OutputStamps`` serves a block's ``__iter__`` generator
(``GeneratorRun``) or, for a user-defined block written with ``async_next``,
the wrapper ``_numbering.py`` installs. A block that stamps its outputs itself
(``set_item_stamp(stamp, output=j)``) makes a new key, which is kept.
"""

from __future__ import annotations

from typing import Any

from ._context import _ITEM, ItemStamp, output_stamp

__all__ = ["OutputStamps"]


class OutputStamps:
    """The last input a block pulled and how many outputs it made of it."""

    __slots__ = ("input_stamp", "outputs")

    def __init__(self) -> None:
        self.input_stamp: ItemStamp | None = None
        self.outputs = 0  # outputs made of input_stamp's item so far, minus one

    def before_call(self) -> ItemStamp:
        """Stamp the thread as the output the block makes next if it pulls nothing; return it.

        ``item_rng()`` draws the block makes for that output (between two
        ``yield``) are then its own, not the previous output's.
        """
        stamp = self.input_stamp
        if stamp is None:
            return _ITEM.stamp
        if self.outputs >= 0:
            stamp = output_stamp(stamp, self.outputs + 1)
        _ITEM.stamp = stamp
        return stamp

    def after_output(self, expected: ItemStamp) -> bool:
        """Note the output just made (``expected``: what :meth:`before_call` returned).

        Returns True when it was made without a pull (it keeps ``expected``'s key).
        """
        after = _ITEM.stamp
        # _another_item(after, expected), inlined: this runs once per output
        if self.input_stamp is None or (
            after is not expected
            and (after[2] != expected[2] or after[0] != expected[0] or after[1] != expected[1])
        ):
            self.input_stamp, self.outputs = after, 0  # a pull (or a stamp the block set)
            return False
        self.outputs += 1
        return True

    def after_wait(self, expected: ItemStamp) -> None:
        """The block raised ``NotAvailable``: an input it pulled meanwhile is numbered from."""
        after = _ITEM.stamp
        if after is not expected and (self.input_stamp is None or _another_item(after, expected)):
            self.input_stamp, self.outputs = after, -1  # it pulled an input before it waited

    def state(self) -> list[Any] | None:
        """What a checkpoint keeps (None: nothing pulled yet)."""
        return None if self.input_stamp is None else [list(self.input_stamp), self.outputs]

    def load(self, state: Any) -> None:
        """Restore :meth:`state`'s value (None: start afresh)."""
        if state is None:
            self.input_stamp, self.outputs = None, 0
            return
        seed, epoch, key, draws = state[0]
        key = tuple(key) if isinstance(key, list) else key
        self.input_stamp, self.outputs = (seed, epoch, key, draws), int(state[1])


def _another_item(after: ItemStamp, expected: ItemStamp) -> bool:
    """Whether the thread's stamp ``after`` is another item's than ``expected`` (a pull)."""
    return after is not expected and (
        after[2] != expected[2] or after[0] != expected[0] or after[1] != expected[1]
    )
