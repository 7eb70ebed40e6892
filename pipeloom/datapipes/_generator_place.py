"""Whether a block's ``__iter__`` generator makes outputs without pulling inputs, so ``{}``
cannot resume it.

A generator's local variables cannot be saved, so a block written the simple
way resumes by starting its generator again, after the input its parent
resumes at. That is exact for a generator that yields at most one output per
input it pulls (a map, a filter) and whose ``state_dict()`` is ``{}``. One
that yields several outputs of one input (the records of a file, the windows
of a sequence) or an output without pulling one (a header) would, on resume,
skip the rest of an input's outputs or repeat the extra one, silently. An
output made without a pull leaves the thread's item stamp as it was (every
pull stamps the item it returns), so the block base, which drives the
generator, notes it for the block's class; from then on (for every block of
that class, in this process) a ``{}`` state taken inside an epoch is refused
here with a message that says what to do. A checkpoint taken before the
class's first such output cannot be told apart and is not refused.

Example:
    >>> from pipeloom.datapipes import IterableWrapper, IterDataPipe
    >>> from pipeloom.datapipes._pipeline import pipeline_state_dict
    >>> class Twice(IterDataPipe):
    ...     inputs = ("source",)
    ...     def __init__(self, source):
    ...         self.source = source
    ...     def __iter__(self):
    ...         for x in self.source:
    ...             yield x
    ...             yield x
    ...     def state_dict(self):
    ...         return {}
    >>> pipe = Twice(IterableWrapper(range(3))).map(str)
    >>> it = iter(pipe)
    >>> next(it), next(it), next(it)
    ('0', '0', '1')
    >>> pipeline_state_dict(pipe)
    Traceback (most recent call last):
    ...
    pipeloom.errors.StateError: block #1 Twice(): its __iter__ generator yielded an output ...
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import StateError
from ._context import _ITEM
from ._nesting import NESTING, nested_call
from ._output_stamps import OutputStamps

__all__ = ["GeneratorRun", "check_generator_place", "route_iter"]


class GeneratorRun:
    """A block's own ``__iter__`` generator, run one output at a time.

    Every pull stamps the item it returns, so an output made without one finds
    the thread's stamp as the previous output left it (``made_without_pull``).
    Such an output is stamped as output ``j`` of the last input pulled (key
    ``(p, j)``, ``j`` counting from 1; the first output keeps ``p``), as
    ``flatmap`` stamps its outputs: its ``item_rng()`` draws differ from the
    other outputs' also where a block downstream keeps each item's stamp
    (``shuffle``, ``prefetch``, ``threadpool_map``), and do not depend on the
    draws made for the outputs before it. A stamp the generator set itself
    with ``set_item_stamp(stamp, output=j)`` is kept. User-defined blocks
    written with ``async_next`` get the same numbering from the wrapper
    ``_numbering.py`` installs (both use ``_output_stamps.py``).

    A block whose outputs the framework numbers (a source of the user's, or the
    sharding root: ``_numbering.py``) gets each output's position instead, and its
    code runs keyed by the position of the output it is making.
    """

    __slots__ = ("_gen", "_kind", "_numbered", "made_without_pull", "outputs")

    def __init__(self, block: Any) -> None:
        self.outputs = OutputStamps()  # see _output_stamps.py
        self.outputs.input_stamp = _ITEM.stamp
        self.made_without_pull = False
        self._numbered = block._numbering().active is True
        method = type(block).__iter__
        gen = nested_call(getattr(method, "runs_generator", method), block)  # see route_iter
        if not hasattr(gen, "__next__"):
            kind = type(block).__name__
            raise TypeError(
                f"{kind}.__iter__ must return an iterator, got {type(gen).__name__}; write "
                f"it as a generator (yield each item) or return iter(...) of the items"
            )
        self._gen: Iterator[Any] = gen
        self._kind = type(block).__name__

    def next_output(self) -> Any:
        """The generator's next output, stamped as above (``StopIteration`` at its end)."""
        if self._numbered:  # keyed and stamped by its numbering
            return self._next()
        expected = self.outputs.before_call()
        item = self._next()
        self.made_without_pull = self.outputs.after_output(expected)
        return item

    def _next(self) -> Any:
        try:
            return nested_call(next, self._gen)
        except RuntimeError as error:
            if isinstance(error.__cause__, StopIteration) and "raised StopIteration" in str(error):
                raise RuntimeError(
                    f"{self._kind}.__iter__ raised StopIteration inside its generator, which "
                    f"Python turns into this RuntimeError (PEP 479) instead of ending it; end "
                    f"the generator with return (catch the StopIteration of a next() call)"
                ) from error
            raise


def check_generator_place(index: int, block: Any, state: Any) -> None:
    """Refuse the ``{}`` state of a generator that stopped inside an input."""
    stopped = getattr(block, "_stopped_in_generator", None)  # map-style blocks have none
    if state or stopped is None or not stopped():
        return
    if block._numbering().active:  # a source or sharding root: numbered, resumed by replay
        return
    raise StateError(
        f"block #{index} {block!r}: its __iter__ generator yielded an output without "
        f"pulling an input (several outputs of one input, or an extra one) and its "
        f"state_dict() returned {{}}, so a resume would skip the rest of that input's "
        f"outputs or repeat one. Write the block with async_next() and keep its place "
        f"inside the input in attributes that state_dict() returns (see "
        f"docs/write_your_own_block.md, Checkpoints), or build the DataLoader with "
        f"resume_by_replay=True"
    )


def route_iter(cls: type, protocol_iter: Callable[[Any], Iterator[Any]]) -> None:
    """Make ``iter(block)`` of a generator block defined outside pipeloom go through the
    async protocol (``protocol_iter``); the class's own ``__iter__``, which
    :class:`GeneratorRun` runs, stays the new method's ``runs_generator``.

    Without it, a block reading another user-defined generator block (``for x in
    self.source``) ran that block's generator directly, past everything the protocol
    does per output: positions were not stamped (``item_rng()`` downstream raised, or
    drew from a stale item's key), outputs not numbered, and a checkpoint could not tell
    where that block was. A top-level ``iter(block)`` (``list(block)`` outside a
    loader) and a subclass's ``super().__iter__()`` still run the generator itself.
    """
    own = cls.__dict__.get("__iter__")
    if own is None or cls.__module__.startswith("pipeloom.") or "async_next" in cls.__dict__:
        return

    @functools.wraps(own)
    def __iter__(self: Any) -> Iterator[Any]:
        if NESTING.depth and getattr(type(self).__iter__, "runs_generator", None) is own:
            return protocol_iter(self)
        return own(self)  # a top-level iter(), or a subclass's super().__iter__()

    __iter__.runs_generator = own  # type: ignore[attr-defined]
    cls.__iter__ = __iter__  # type: ignore[attr-defined]
