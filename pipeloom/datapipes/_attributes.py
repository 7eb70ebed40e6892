"""A block's attribute values, read without slowing the block down.

CPython 3.11+ keeps an object's attributes in an inline array and specializes
attribute access on it; ``vars(obj)`` turns that array into a real ``__dict__``
for the rest of the object's life, and every later ``self.x`` in the block's
per-item code gets slower (about 40% for a source's ``async_next``). The
graph walk looks at blocks at every epoch, so it reads their values through
``gc.get_referents`` instead, which leaves the array alone. ``vars()`` is kept
for the rare paths that need attribute *names* (editing the graph, errors).

Example:
    >>> class Box:
    ...     def __init__(self):
    ...         self.a, self.b = 1, [2]
    >>> attribute_values(Box())
    [1, [2]]
"""

from __future__ import annotations

import gc
from typing import Any

__all__ = ["attribute_values", "blocks_in", "declared_input"]

_MISSING = object()


def attribute_values(obj: Any) -> list[Any]:
    """The values of ``obj``'s instance attributes, in the order they were set."""
    values = [value for value in gc.get_referents(obj) if value is not type(obj)]
    if len(values) == 1 and type(values[0]) is dict and _is_instance_dict(obj, values[0]):
        return list(values[0].values())  # the dict exists already: nothing more to lose
    return values


def _is_instance_dict(obj: Any, candidate: dict) -> bool:
    """True when ``candidate`` is ``obj.__dict__`` (asked without creating that dict)."""
    return all(
        type(name) is str and getattr(obj, name, _MISSING) is value
        for name, value in candidate.items()
    )


def blocks_in(value: Any, kind: type) -> list[Any]:
    """The blocks (instances of ``kind``) an input attribute holds: a block, or a
    list/tuple/dict of them.

    A container counts when its first element is a block (a look at one
    element, so a long list of file names costs nothing).
    """
    if isinstance(value, kind):
        return [value]
    if isinstance(value, (list, tuple)):
        if value and isinstance(value[0], kind):
            return [v for v in value if isinstance(v, kind)]
    elif isinstance(value, dict) and value:
        values = list(value.values())
        if isinstance(values[0], kind):
            return [v for v in values if isinstance(v, kind)]
    return []


def declared_input(block: Any, name: str) -> Any:
    """The value of the attribute ``name`` that ``block``'s ``inputs`` declares."""
    try:
        return getattr(block, name)
    except AttributeError as error:
        kind = type(block).__name__
        raise AttributeError(
            f"{kind}.inputs = {type(block).inputs!r} names {name!r}, but this {kind} has no "
            f"attribute {name!r} ({error}); set self.{name} to the upstream block in "
            f"{kind}.__init__, or list in inputs only the attributes that hold upstream blocks"
        ) from error
