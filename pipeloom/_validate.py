"""Argument checks shared by every part of pipeloom: one wording for each mistake.

Each check says what was expected, what was got and, with ``hint``, how to
fix it; it returns the value, so a constructor can write
``self.size = check_int("size", size, minimum=1)``. Checks run once, at
construction, never per item.

A value outside an int's range and a value that is no int at all are the same
mistake for an option with a range (``ValueError``); a pure type check
(``check_int`` without ``minimum``, ``check_bool``, ``check_callable``) raises
``TypeError``.

Example:
    >>> check_int("num_workers", 2, minimum=0)
    2
    >>> check_int("num_workers", -1, minimum=0, hint="use 0 to load in the calling thread")
    Traceback (most recent call last):
    ...
    ValueError: num_workers must be an int >= 0, got -1; use 0 to load in the calling thread
    >>> check_bool("persistent_workers", "no")
    Traceback (most recent call last):
    ...
    TypeError: persistent_workers must be a bool, got str 'no'; pass True or False
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from typing import Any, TypeVar

__all__ = [
    "check_bool",
    "check_callable",
    "check_choice",
    "check_index",
    "check_int",
    "check_seconds",
]

T = TypeVar("T")


def _tail(hint: str) -> str:
    return f"; {hint}" if hint else ""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def as_length(value: Any) -> int | None:
    """``value`` as a Python int when it is an integer (a NumPy integer, a 0-d
    integer tensor), else None; ``True``/``False`` are not lengths.

    Example:
        >>> import numpy as np
        >>> as_length(np.int64(3)), as_length(2.0), as_length(True)
        (3, None, None)
    """
    if isinstance(value, bool) or str(getattr(value, "dtype", "")) in ("bool", "torch.bool"):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_int(
    name: str, value: T, *, minimum: int | None = None, allow_none: bool = False, hint: str = ""
) -> T:
    """``value`` if it is an int (``>= minimum`` when given; None when ``allow_none``).

    Raises:
        ValueError: with ``minimum``, for any other value.
        TypeError: without ``minimum``, for a value that is not an int.
    """
    if value is None and allow_none:
        return value
    if _is_int(value) and (minimum is None or value >= minimum):  # type: ignore[operator]
        return value
    expected = "an int" + ("" if minimum is None else f" >= {minimum}")
    expected += " or None" if allow_none else ""
    if minimum is None:
        got = f"{type(value).__name__} {value!r}"
        raise TypeError(f"{name} must be {expected}, got {got}{_tail(hint)}")
    raise ValueError(f"{name} must be {expected}, got {value!r}{_tail(hint)}")


def check_index(name: str, value: T, total: int, *, hint: str = "") -> T:
    """``value`` if it is an int with ``0 <= value < total``, else ``ValueError``."""
    if _is_int(value) and 0 <= value < total:  # type: ignore[operator]
        return value
    raise ValueError(f"{name} must be an int in [0, {total}), got {value!r}{_tail(hint)}")


def check_seconds(
    name: str,
    value: T,
    *,
    zero_ok: bool = False,
    allow_none: bool = False,
    also: str = "",
    hint: str = "",
) -> T:
    """``value`` if it is a number of seconds ``> 0`` (``>= 0`` with ``zero_ok``).

    ``also`` names another accepted form in the message (e.g. ``"a datetime.timedelta"``).

    Raises:
        ValueError: for any other value.
    """
    if value is None and allow_none:
        return value
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and value == math.inf:  # waits, locks and Ray raise OverflowError on it, later
        fix = "pass None to wait without a limit" if allow_none else "pass a large number"
        raise ValueError(
            f"{name} must be a finite number of seconds, got {value!r}; {fix}{_tail(hint)}"
        )
    if number and (value >= 0 if zero_ok else value > 0):  # type: ignore[operator]
        return value
    expected = f"a number of seconds {'>=' if zero_ok else '>'} 0"
    expected += " or None" if allow_none else ""
    expected += f" or {also}" if also else ""
    raise ValueError(f"{name} must be {expected}, got {value!r}{_tail(hint)}")


def check_bool(name: str, value: T, *, hint: str = "") -> T:
    """``value`` if it is ``True`` or ``False``; a truthy string or number is refused.

    Raises:
        TypeError: for anything but a bool (``"no"`` would otherwise count as True).
    """
    if isinstance(value, bool):
        return value
    got = f"{type(value).__name__} {value!r}"
    raise TypeError(f"{name} must be a bool, got {got}; pass True or False{_tail(hint)}")


def check_callable(name: str, value: T, *, allow_none: bool = False, hint: str = "") -> T:
    """``value`` if it can be called (or is None with ``allow_none``), else ``TypeError``."""
    if callable(value) or (value is None and allow_none):
        return value
    expected = "callable" + (" or None" if allow_none else "")
    raise TypeError(f"{name} must be {expected}, got {type(value).__name__}{_tail(hint)}")


def check_choice(
    name: str, value: T, choices: Iterable[Any], *, allow_none: bool = False, hint: str = ""
) -> T:
    """``value`` if it is one of ``choices`` (or None with ``allow_none``), else ``ValueError``."""
    options = list(choices)
    if (value is None and allow_none) or value in options:
        return value
    expected = ", ".join(repr(option) for option in options)
    expected += " or None" if allow_none else ""
    raise ValueError(f"{name} must be one of {expected}, got {value!r}{_tail(hint)}")
