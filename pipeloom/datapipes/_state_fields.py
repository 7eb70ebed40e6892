"""Reading typed fields from a saved state, so a damaged state fails loudly, not silently.

A checkpoint travels through files, ``torch.load`` and sometimes hand edits;
a ``position`` of ``3.5`` or a ``batch`` of ``'xyz'`` must not resume "fine" at
the wrong place. ``load_state_dict`` implementations read their fields through
:class:`StateFields`, which checks each value's type and range and raises
``StateError`` naming the block and the field.
"""

from __future__ import annotations

import builtins
import random
from typing import Any

from ..errors import StateError

__all__ = ["StateFields", "state_count", "state_field"]

_MISSING: Any = object()


class StateFields:
    """Typed, range-checked reads of the fields of ``owner``'s saved ``state``.

    Args:
        owner: the block (or other object) the state belongs to; its ``repr``
            names it in errors. A string is used as is.
        state: what ``owner.state_dict()`` returned; it must be a dict.

    Every reader raises ``StateError`` saying which field of which block holds
    what, and what was expected. A ``default`` is returned when the field is
    absent (states saved before the field existed); without one, absence is
    an error too.

    Example:
        >>> fields = StateFields("Header(limit=3)", {"count": 2})
        >>> fields.int("count")
        2
        >>> StateFields("Header(limit=3)", {"count": 3.5}).int("count")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        pipeloom.errors.StateError: Header(limit=3): the state's field 'count' must be an int ...
    """

    def __init__(self, owner: object, state: Any) -> None:
        self.owner = owner if isinstance(owner, str) else repr(owner)
        if not isinstance(state, dict):
            raise StateError(
                f"{self.owner}: expected its state as a dict (what state_dict() returned), got "
                f"{_show(state)}; the state is damaged or was saved from another pipeline"
            )
        self.state = state

    # -- readers -------------------------------------------------------------------
    def int(
        self,
        name: str,
        *,
        minimum: builtins.int | None = 0,
        maximum: builtins.int | None = None,
        default: Any = _MISSING,
    ) -> builtins.int:
        """An int (not a bool) in ``[minimum, maximum]`` (None: unbounded)."""
        if name not in self.state and default is not _MISSING:
            return default
        value = self._get(name, default)
        if not _is_int(value) or not _in_range(value, minimum, maximum):
            self.fail(name, _int_range(minimum, maximum), value)
        return int(value)

    def optional_int(
        self, name: str, *, minimum: builtins.int | None = 0, default: Any = _MISSING
    ) -> Any:
        """None or an int >= ``minimum``."""
        value = self._get(name, default)
        if value is None:
            return None
        if not _is_int(value) or not _in_range(value, minimum, None):
            self.fail(name, "None or " + _int_range(minimum, None), value)
        return int(value)

    def bool(self, name: str, *, default: Any = _MISSING) -> builtins.bool:
        """True or False (0 and 1 are refused: a saved flag is a bool)."""
        value = self._get(name, default)
        if not isinstance(value, bool):
            self.fail(name, "a bool", value)
        return value

    def list(self, name: str, *, default: Any = _MISSING) -> builtins.list[Any]:
        """A list (or tuple) of anything: buffered items, returned as a new list."""
        value = self._get(name, default)
        if not isinstance(value, (list, tuple)):
            self.fail(name, "a list", value)
        return list(value)

    def stamp(self, name: str, *, default: Any = _MISSING) -> tuple:
        """An item stamp ``(seed, epoch, key[, draws])`` (key: a position or ``(p, j, ...)``)."""
        return self._check_stamp(name, self._get(name, default))

    def stamps(self, name: str, *, length: builtins.int | None = None) -> builtins.list[tuple]:
        """A list of item stamps, ``length`` of them when given (one per buffered item)."""
        values = self.list(name)
        if length is not None and len(values) != length:
            self.fail(name, f"a list of {length} stamps (one per buffered item)", values)
        return [self._check_stamp(name, value) for value in values]

    def stamped_items(
        self, name: str, *, value: Any = _MISSING
    ) -> builtins.list[tuple[Any, tuple]]:
        """A list of ``(item, stamp)`` pairs: buffered items with their stamps.

        ``value``: check this (e.g. one of several lists inside the field) instead
        of the field itself.
        """
        pairs = self._get(name, _MISSING) if value is _MISSING else value
        if not isinstance(pairs, (list, tuple)) or not all(
            isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in pairs
        ):
            self.fail(name, "a list of (item, stamp) pairs", pairs)
        return [(item, self._check_stamp(name, stamp)) for item, stamp in pairs]

    def rng(self, name: str, *, default: Any = _MISSING) -> random.Random | None:
        """None or a ``random.Random`` restored from ``getstate()``."""
        value = self._get(name, default)
        if value is None:
            return None
        rng = random.Random()
        try:
            rng.setstate(value)
        except (TypeError, ValueError, OverflowError):
            self.fail(name, "None or a random.Random().getstate() tuple", value)
        return rng

    def fail(self, name: str, expected: str, value: Any) -> Any:
        """Raise the ``StateError`` for field ``name`` (also for checks made by the caller)."""
        raise StateError(
            f"{self.owner}: the state's field {name!r} must be {expected}, got {_show(value)}; "
            f"the state is damaged or was saved from another pipeline"
        )

    # -- internals -----------------------------------------------------------------
    def _get(self, name: str, default: Any) -> Any:
        if name in self.state:
            return self.state[name]
        if default is _MISSING:
            raise StateError(
                f"{self.owner}: the state has no field {name!r} (it has "
                f"{sorted(map(str, self.state)) or 'none'}); the state is damaged or was "
                f"saved from another pipeline"
            )
        return default

    def check_stamp(self, name: str, value: Any) -> tuple:
        """``value`` (part of field ``name``) as an item stamp, or raise ``StateError``."""
        return self._check_stamp(name, value)

    def _check_stamp(self, name: str, value: Any) -> tuple:
        ok = isinstance(value, (tuple, list)) and len(value) in (3, 4)
        if ok:
            seed, epoch, position = value[0], value[1], value[2]
            draws = value[3] if len(value) == 4 else 0
            ok = (
                (seed is None or _is_int(seed))
                and _is_int(epoch)
                and epoch >= 0
                and (position is None or _is_key(position))
                and _is_int(draws)
                and draws >= 0
            )
        if not ok:
            self.fail(
                name, "item stamps (seed, epoch, key, draws) of ints (key: p or (p, j, ...))", value
            )
        if isinstance(value[2], list):  # a key that went through JSON
            return (value[0], value[1], tuple(value[2]), *value[3:])
        return tuple(value)


def _is_key(value: Any) -> bool:
    """An item key: a position ``p >= 0``, or ``(p, j, ...)`` of at least two such ints."""
    if isinstance(value, (tuple, list)):
        return len(value) >= 2 and all(_is_int(part) and part >= 0 for part in value)
    return _is_int(value) and value >= 0


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _in_range(value: int, minimum: int | None, maximum: int | None) -> bool:
    return (minimum is None or value >= minimum) and (maximum is None or value <= maximum)


def _int_range(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an int in [{minimum}, {maximum}]"
    if minimum is not None:
        return f"an int >= {minimum}"
    if maximum is not None:
        return f"an int <= {maximum}"
    return "an int"


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{text} ({type(value).__name__})"


def state_field(block: object, state: Any, name: str) -> Any:
    """``state[name]``, or a StateError naming the block and the field."""
    if not isinstance(state, dict) or name not in state:
        raise StateError(
            f"{block!r}: the state must be a dict with the field {name!r}, got {state!r:.100}; "
            f"load a state saved from the same pipeline"
        )
    return state[name]


def state_count(block: object, state: Any, name: str) -> int:
    """``state[name]`` checked to be an int >= 0, or a StateError naming the block and field."""
    value = state_field(block, state, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StateError(
            f"{block!r}: state field {name!r} must be an int >= 0, got {value!r:.100}; "
            f"the state is damaged or from another pipeline"
        )
    return value
