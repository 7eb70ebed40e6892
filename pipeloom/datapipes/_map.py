"""``map``: apply a function to each item, or to some columns of it.

The column logic (``input_col`` / ``output_col``) is shared with ``filter`` and
``flatmap``. Which code path an item takes is decided once, at construction:
without columns ``async_next`` calls ``fn`` directly; with columns it calls a
``functools.partial`` of one module-level function (picklable, no closure).
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from ._base import IterDataPipe, MapDataPipe
from ._context import current_position
from ._runs import Stage

__all__ = ["Mapper", "MapMapper"]

Col = Hashable | Sequence[Hashable] | None


class Mapper(IterDataPipe):
    """Apply ``fn`` to each item, or to ``input_col`` of it (functional name: ``map``).

    Args:
        source: the upstream block.
        fn: the function to apply.
        input_col: ``None`` passes the whole item; an index or key passes
            ``item[input_col]``; a list/tuple of them passes several positional
            arguments.
        output_col: where the result goes. ``None`` replaces ``input_col``
            (with several input columns: the first, the others are removed) or
            the whole item; ``-1`` appends it; an index or key writes there.
            Tuples are rebuilt and lists/dicts copied shallowly: the input item
            is never modified.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper([(1, 2), (3, 4)]).map(lambda x: x * 10, input_col=1))
        [(1, 20), (3, 40)]
        >>> list(IterableWrapper([[1, 2]]).map(lambda a, b: a + b, input_col=[0, 1], output_col=-1))
        [[1, 2, 3]]
    """

    inputs = ("source",)
    per_item = True
    one_to_one = True

    def __init__(
        self,
        source: IterDataPipe,
        fn: Callable[..., Any],
        input_col: Col = None,
        output_col: Col = None,
    ) -> None:
        self.source, self.fn, self.input_col, self.output_col = source, fn, input_col, output_col
        self._apply = make_map_function(fn, input_col, output_col, owner="map")

    def async_next(self) -> Any:
        item = self.source.async_next()
        try:
            return self._apply(item)
        except Exception as error:
            raise_with_note(error, self, current_position())

    def _run_stage(self) -> Stage:
        """In a fused run (``_runs.py``): the function, its errors noted as ``async_next`` does."""
        return Stage(self._apply, self._note_error)

    def _note_error(self, error: Exception) -> None:
        raise_with_note(error, self, current_position())

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({map_args(self)})"


class MapMapper(MapDataPipe):
    """Apply ``fn`` to item ``index`` of a map-style block on access (functional name: ``map``).

    Takes the same ``input_col`` / ``output_col`` as :class:`Mapper`.

    Example:
        >>> from pipeloom.datapipes import SequenceWrapper
        >>> dp = SequenceWrapper([1, 2, 3]).map(lambda x: x + 1)
        >>> dp[2], len(dp)
        (4, 3)
    """

    inputs = ("source",)
    per_item = True
    one_to_one = True

    def __init__(
        self,
        source: MapDataPipe,
        fn: Callable[..., Any],
        input_col: Col = None,
        output_col: Col = None,
    ) -> None:
        self.source, self.fn, self.input_col, self.output_col = source, fn, input_col, output_col
        self._apply = make_map_function(fn, input_col, output_col, owner="map")

    def async_get(self, index: int) -> Any:
        item = self.source.async_get(index)
        try:
            return self._apply(item)
        except Exception as error:
            raise_with_note(error, self, index, what="index")

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({map_args(self)})"


# -- shared with filter / flatmap --------------------------------------------------


def raise_with_note(error: Exception, block: Any, position: Any, what: str = "position") -> None:
    """Re-raise ``error`` from a user function, noting the block and the item.

    A ``StopIteration`` (or ``NotAvailable``) escaping the function would be
    mistaken for the end of the stream (or "not ready"), so it becomes a
    ``RuntimeError``; every other exception keeps its type and traceback.
    """
    from ..errors import NotAvailable

    note = f"raised by the function of {block!r} on the item at {what} {position}"
    if isinstance(error, (StopIteration, NotAvailable)):
        raise RuntimeError(
            f"the function of {block!r} raised {type(error).__name__} on the item at "
            f"{what} {position}; a user function must not raise it (it would end or "
            f"stall the stream)"
        ) from error
    error.add_note(note)
    raise error


def map_args(block: Any) -> str:
    """``fn=...`` plus the column arguments that are set."""
    text = f"fn={fn_name(block.fn)}"
    for name in ("input_col", "output_col"):
        value = getattr(block, name, None)
        if value is not None:
            text += f", {name}={value!r}"
    return text


def fn_name(fn: Any) -> str:
    """How ``repr`` of a block shows a function: its ``__qualname__``."""
    name = getattr(fn, "__qualname__", None)
    if isinstance(name, str):
        return name
    text = repr(fn)
    return text if len(text) <= 60 else text[:57] + "..."


def check_callable(fn: Any, name: str, owner: str, nargs: int) -> None:
    """Raise TypeError/ValueError unless ``fn`` can be called with ``nargs`` arguments."""
    if not callable(fn):
        raise TypeError(
            f"{owner}() expects {name} to be a callable, got {type(fn).__name__} {fn!r}; "
            f"pass a function such as lambda x: x"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature
        return
    try:
        signature.bind(*range(nargs))
    except TypeError:
        raise ValueError(
            f"{owner}() calls {name} with {nargs} positional argument"
            f"{'s' if nargs != 1 else ''} (one per input column), but "
            f"{fn_name(fn)}{signature} does not accept that; change input_col or the "
            f"function's parameters"
        ) from None


def parse_input_col(input_col: Col, owner: str) -> tuple[Any, bool]:
    """Return ``(column(s), several)``; several columns become a tuple."""
    if isinstance(input_col, (list, tuple)):
        if not input_col:
            raise ValueError(
                f"{owner}() got an empty input_col {input_col!r}; pass None for the "
                f"whole item, or name at least one column"
            )
        for col in input_col:
            _check_hashable(col, "input_col", owner)
        return tuple(input_col), True
    if input_col is not None:
        _check_hashable(input_col, "input_col", owner)
    return input_col, False


def make_reader(
    fn: Callable[..., Any], input_col: Col, owner: str, name: str
) -> Callable[[Any], Any]:
    """Validate ``fn``/``input_col`` and return ``item -> fn(selected columns)``."""
    col, several = parse_input_col(input_col, owner)
    check_callable(fn, name, owner, len(col) if several else 1)
    if col is None and not several:
        return fn
    if several:
        return functools.partial(_call_cols, fn, col)
    return functools.partial(_call_col, fn, col)


def make_map_function(fn: Callable[..., Any], input_col: Col, output_col: Col, owner: str):
    """The per-item function of ``map`` for this configuration."""
    reader = make_reader(fn, input_col, owner, "fn")
    col, several = parse_input_col(input_col, owner)
    if isinstance(output_col, (list, tuple)):  # torchdata accepts a one-element list
        if len(output_col) != 1:
            raise ValueError(
                f"{owner}() writes one result, so output_col must be a single index or "
                f"key, got {output_col!r}; return a tuple and write it to one column"
            )
        output_col = output_col[0]
    if output_col is not None and input_col is None:
        raise ValueError(
            f"{owner}() got output_col={output_col!r} but input_col=None; output_col "
            f"says where to write the result of fn(item[input_col]), so set input_col "
            f"too, or drop output_col to replace the whole item"
        )
    if col is None and not several:
        return reader
    if output_col is None:
        target = col[0] if several else col
        drop = _drop_order(col[1:]) if several else ()
    else:
        _check_hashable(output_col, "output_col", owner)
        if output_col == -1 and not isinstance(output_col, bool):
            return functools.partial(_map_append, reader)
        target, drop = output_col, ()
    if several or drop:
        return functools.partial(_map_store, reader, target, drop)
    return functools.partial(_map_col, fn, col, target)


def _check_hashable(col: Any, name: str, owner: str) -> None:
    try:
        hash(col)
    except TypeError:
        raise TypeError(
            f"{owner}() expects {name} to be an index or a key (hashable), got "
            f"{type(col).__name__} {col!r}"
        ) from None


def _drop_order(cols: tuple) -> tuple:
    if all(isinstance(c, int) for c in cols):
        return tuple(sorted(cols, reverse=True))  # delete from the back: indices stay valid
    return cols


def _call_col(fn, col, item):
    return fn(item[col])


def _call_cols(fn, cols, item):
    return fn(*[item[c] for c in cols])


def _map_col(fn, col, key, item):
    """Fast path: one input column, no columns to remove."""
    cls = type(item)
    if cls is tuple:
        new = list(item)
        new[key] = fn(item[col])
        return tuple(new)
    if cls is list or cls is dict:
        new = item.copy()
        new[key] = fn(item[col])
        return new
    return _map_store(functools.partial(_call_col, fn, col), key, (), item)


def _map_store(reader, key, drop, item):
    value = reader(item)
    cls = type(item)
    if cls is list or cls is dict:
        new = item.copy()
    elif isinstance(item, tuple):
        new = list(item)
        new[key] = value
        for col in drop:
            del new[col]
        return _rebuild_tuple(item, new)
    else:
        new = copy.copy(item)
    new[key] = value
    for col in drop:
        del new[col]
    return new


def _map_append(reader, item):
    value = reader(item)
    cls = type(item)
    if cls is tuple:
        return item + (value,)
    if cls is list:
        return [*item, value]
    if isinstance(item, tuple):
        return (*item, value)
    if isinstance(item, list):
        new = copy.copy(item)
        new.append(value)
        return new
    raise TypeError(
        f"output_col=-1 appends the result to a list or tuple item, got a "
        f"{type(item).__name__}; name the index or key to write instead"
    )


def _rebuild_tuple(original: tuple, values: list) -> tuple:
    cls = type(original)
    if cls is not tuple and hasattr(cls, "_fields") and len(values) == len(original):
        return cls(*values)  # a namedtuple keeps its type
    return tuple(values)
