"""``@functional_datapipe("name")``: a custom block class as a chaining method, ``dp.name(...)``.

A name is taken once: a built-in method or another class's name is refused
unless ``replace=True``. Defining the same class again (same module and
qualified name: a notebook cell run twice) replaces the method quietly.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ._base import DataPipe

__all__ = ["functional_datapipe"]

B = TypeVar("B", bound=type)

# (IterDataPipe or MapDataPipe, name) -> (the class registered, the method made for it)
_REGISTERED: dict[tuple[type, str], tuple[type, Callable[..., Any]]] = {}


def functional_datapipe(name: str, *, replace: bool = False) -> Callable[[B], B]:
    """Register a block class under a functional name: ``dp.<name>(...)``.

    The method calls ``cls(dp, *args, **kwargs)``. Registering a name that
    exists raises unless ``replace=True``, or unless it was registered for a
    class of the same module and qualified name: running a notebook cell that
    defines the class again replaces the old class.

    Example:
        >>> from pipeloom.datapipes import IterDataPipe, IterableWrapper, functional_datapipe
        >>> @functional_datapipe("times_ten")
        ... class TimesTen(IterDataPipe):
        ...     inputs = ("source",)
        ...     def __init__(self, source):
        ...         self.source = source
        ...     def __iter__(self):
        ...         return (x * 10 for x in self.source)
        >>> list(IterableWrapper([1, 2]).times_ten())
        [10, 20]
    """
    from ._base import IterDataPipe, MapDataPipe

    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        raise ValueError(
            f"a functional name must be a public Python identifier like 'my_block', got {name!r}"
        )

    def register(cls: B) -> B:
        if isinstance(cls, type) and issubclass(cls, IterDataPipe):
            target: type[DataPipe] = IterDataPipe
        elif isinstance(cls, type) and issubclass(cls, MapDataPipe):
            target = MapDataPipe
        else:
            raise TypeError(
                f"@functional_datapipe({name!r}) decorates IterDataPipe or MapDataPipe "
                f"subclasses, got {cls!r}"
            )
        existing = getattr(target, name, None)
        if existing is not None and not replace and not _redefines(target, name, cls):
            raise ValueError(
                f"{target.__name__} already has a method {name!r}{_owner(target, name)}; "
                f"pick another name for {cls.__qualname__}, or pass replace=True to override it"
            )

        def method(self, *args: Any, **kwargs: Any) -> Any:
            return cls(self, *args, **kwargs)

        method.__name__ = method.__qualname__ = name
        method.__doc__ = cls.__doc__
        try:
            params = list(inspect.signature(cls).parameters.values())[1:]
            method.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
                [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *params]
            )
        except (TypeError, ValueError):
            pass
        setattr(target, name, method)
        _REGISTERED[target, name] = (cls, method)
        return cls

    return register


def _registered(target: type, name: str) -> type | None:
    """The class ``name`` was registered for, if the method is still the one made for it."""
    cls, method = _REGISTERED.get((target, name), (None, None))
    return cls if cls is not None and target.__dict__.get(name) is method else None


def _redefines(target: type, name: str, cls: type) -> bool:
    """``cls`` is a new definition of the class ``name`` was registered for."""
    old = _registered(target, name)
    return old is not None and (old.__module__, old.__qualname__) == (
        cls.__module__,
        cls.__qualname__,
    )


def _owner(target: type, name: str) -> str:
    old = _registered(target, name)
    return f" (registered for {old.__module__}.{old.__qualname__})" if old is not None else ""
