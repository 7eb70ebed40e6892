"""A block that stamps its outputs' positions must stamp every output.

A block that sets ``stamps_positions = True`` calls ``self.stamp_position(p)``
(or ``output=j``) before each output. One that misses it on some path returns
the item with the previous item's key: it draws that item's ``item_rng()``
values and, under workers, is merged by that stale position (out of order),
all silently. So an output that neither stamped a position nor pulled an input
(every pull stamps the item it returns) raises ``ValueError`` naming the block
and the fix, however the block is written:

* with ``async_next``: the class's method is wrapped (:func:`stamp_checked`);
  an item returned with the thread's stamp as it was before the call is refused.
* as an ``__iter__`` generator: the block base notes an output made without a
  pull (``_generator_place.py``), which ``GeneratorRun`` stamps as output ``j``
  of the last input; for such a block it calls :func:`check_stamped`, which
  refuses the output unless its key is the one ``stamp_position`` last set
  (the block may draw ``item_rng()`` between that call and its ``yield``).
  Nothing is checked for an output made after a pull, the usual case.

Example:
    >>> from pipeloom.datapipes import IterableWrapper, IterDataPipe
    >>> class Header(IterDataPipe):
    ...     inputs = ("source",)
    ...     stamps_positions = True
    ...     def __init__(self, source):
    ...         self.source = source
    ...     def __iter__(self):
    ...         for p, x in enumerate(self.source):
    ...             self.stamp_position(p)
    ...             yield x
    ...             yield "header"  # no stamp_position: the previous item's key
    >>> list(Header(IterableWrapper("ab")).map(str))
    Traceback (most recent call last):
    ...
    ValueError: Header sets stamps_positions = True but yielded an item without calling ...
"""

from __future__ import annotations

import functools
from typing import Any

from ._context import _ITEM, current_stamp

__all__ = ["check_stamped", "stamp_checked"]


def missed_stamp(block: Any, did: str) -> ValueError:
    """The error for an output that ``block`` ``did`` (returned, yielded) unstamped."""
    return ValueError(
        f"{type(block).__name__} sets stamps_positions = True but {did} an item without "
        f"calling self.stamp_position(p) (or output=j) first, so the item would share the "
        f"previous item's key and position; call stamp_position before returning each "
        f"item, or remove stamps_positions to have pipeloom number them"
    )


def stamp_checked(method: Any) -> Any:
    """Wrap a ``stamps_positions`` block's ``async_next``: refuse an item that neither
    stamped a position nor pulled an input."""

    @functools.wraps(method)
    def async_next(self: Any) -> Any:
        before = current_stamp()  # not the thread-local itself: the class may be pickled
        item = method(self)
        if current_stamp() is before and before is not None:
            raise missed_stamp(self, "returned")
        return item

    async_next.stamp_check = True  # type: ignore[attr-defined]
    return async_next


def check_stamped(block: Any) -> None:
    """``block``'s generator just yielded an output without a pull: refuse it unless
    ``stamp_position`` set its key (the key ``GeneratorRun`` gave it may be the same)."""
    stamped = _ITEM.positioned
    if stamped is None or stamped[:3] != _ITEM.stamp[:3]:
        raise missed_stamp(block, "yielded")
