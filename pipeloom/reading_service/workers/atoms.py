"""Pickling a pipeline fast when it holds big lists of strings (spawn, forkserver).

A dataset often holds a file list or a caption table: a list of a million
``str``. ``pickle`` memoizes each string (a dict insert per object: ~80% of
the time of pickling such a list) although a list of strings can hold no
cycle, and no shared reference that matters (strings are immutable).

:class:`Pickler` is cloudpickle's pickler, except that a big list or tuple of
``str`` (or of ``bytes``) found in an object's attributes is pickled without
the memo (``Pickler.fast``, turned on for its items only, in the stream): it
is unpickled as any list (a template unpickles while the main process
pickles, item by item), and comes back as a list (tuple) equal to the
original. Sharing is kept as with ``pickle``: once rebuilt, the list is
memoized as the original list (:class:`_Memoized`), so that any other
reference to it, pickled later (another attribute, a dict, another list),
gets the same list. Only the strings inside are not shared with equal
strings elsewhere; a list holding the same string objects many times (a
sample of :data:`_SAMPLE` items has a repeat: labels, ``["train"] * n``) is
pickled as usual, so that a worker holds one string per distinct object.

Only plain objects' attribute dicts are looked at (an object whose class
defines neither ``__reduce__`` nor ``__reduce_ex__``; ``__getstate__`` is
respected): a list found only elsewhere (in a dict, in another list) is
pickled as usual, as is every list of mixed types (a ``str`` subclass
included) or of fewer than :data:`MIN_ITEMS`. A big list must not be changed
by another thread while the pipeline is pickled (as with ``pickle``).
"""

from __future__ import annotations

import importlib
import io
import sys
import types
from typing import Any

import cloudpickle

__all__ = ["MIN_ITEMS", "Pickler", "dump", "dumps"]

MIN_ITEMS = 4096  # a shorter list is pickled as usual
_ATOMS = ({str}, {bytes})
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python
_FRAME = 1 << 17  # bytes the pickler holds before writing them (a frame, 64 KiB, and an item)
_SAMPLE = 1024  # items looked at for repeats: a list of fewer distinct objects has one
_SLICE = 1 << 15  # items whose types are read without a pause for other threads (~2 ms)


class _Atoms:
    """A big list or tuple of ``str``/``bytes``, to pickle without the memo."""

    __slots__ = ("items",)

    def __init__(self, items: list | tuple) -> None:
        self.items = items


class _Items:
    """The items of an :class:`_Atoms`, pickled between a ``_Fast(True)`` and a ``_Fast(False)``."""

    __slots__ = ("items",)

    def __init__(self, items: list | tuple) -> None:
        self.items = items


class _Memoized:
    """Where it is pickled, re-keys the memo entry of an :class:`_Items` to its list.

    The pickler memoizes the :class:`_Items` (an object no one else holds) at
    the index of the rebuilt list; keyed by the list instead, a later
    reference to the list is pickled as a reference to that index.
    """

    __slots__ = ("items",)

    def __init__(self, items: _Items) -> None:
        self.items = items


class _Fast:
    """Turns the pickler's memo off (``on``) or back on where it is pickled, in the stream.

    A fresh one each time: a memoized one would not reach ``reducer_override`` again.
    """

    __slots__ = ("on",)

    def __init__(self, on: bool) -> None:
        self.on = on


class _Counted:
    """A file, counting the bytes written to it (an upper bound of the memo's size)."""

    __slots__ = ("file", "written")

    def __init__(self, file: Any) -> None:
        self.file, self.written = file, 0

    def write(self, data: Any) -> Any:
        self.written += len(data)
        return self.file.write(data)


def _items(_on: bool, items: list | tuple, _off: bool) -> list | tuple:
    return items


def _first(items: list | tuple, _memoized: bool) -> list | tuple:
    return items


def _types(items: list | tuple) -> set[type]:
    """The types of ``items``, looked at a slice at a time: a loop lets another thread take
    the GIL between slices (a warm start's threads run while this pickles), where one
    ``set(map(type, items))`` over a million strings would hold it for ~60 ms."""
    found: set[type] = set()
    for start in range(0, len(items), _SLICE):
        found.update(map(type, items[start : start + _SLICE]))
        if len(found) > 1:
            break
    return found


def _distinct(items: list | tuple) -> bool:
    """Whether a sample of ``items`` holds no object twice (see the module's docstring)."""
    sample = items[:: max(1, len(items) // _SAMPLE)]
    return len(set(map(id, sample))) == len(sample)


class Pickler(cloudpickle.Pickler):
    """cloudpickle's pickler, with big lists of strings in attributes pickled fast."""

    def __init__(self, file: Any, protocol: int | None = None, **kwargs: Any) -> None:
        self._file = _Counted(file)
        super().__init__(self._file, protocol, **kwargs)
        self._atoms: dict[int, tuple[_Atoms, Any]] = {}  # id(list) -> its wrapper, the list

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is _Atoms:  # the list, then its memo entry re-keyed to the original list
            inner = _Items(obj.items)
            return _first, (inner, _Memoized(inner))
        if kind is _Items:  # its items are pickled between a _Fast(True) and a _Fast(False)
            return _items, (_Fast(True), obj.items, _Fast(False))
        if kind is _Memoized:
            self._rekey(obj.items)
            return bool, ()
        if kind is _Fast:
            self.fast = obj.on  # read by the C pickler as it goes: no memo for the items
            return bool, ()
        if isinstance(obj, types.ModuleType) and kind is not types.ModuleType:
            by_name = _module_by_name(obj)
            if by_name is not None:
                return by_name
        reduced = super().reducer_override(obj)
        if (
            reduced is not NotImplemented
            or isinstance(obj, type)  # a class cloudpickle left to pickle (by reference)
            or not kind.__flags__ & _HEAP_TYPE  # a builtin type (function, module, ...)
            or kind.__reduce_ex__ is not object.__reduce_ex__
            or kind.__reduce__ is not object.__reduce__
            or kind in self.dispatch_table
            or not hasattr(obj, "__dict__")
        ):
            return reduced
        reduced = obj.__reduce_ex__(self.proto)  # what pickle would call next
        if type(reduced) is not tuple or len(reduced) < 3 or type(reduced[2]) is not dict:
            return reduced
        state = reduced[2]
        wrapped = {key: self._wrap(value) for key, value in state.items()}
        if all(wrapped[key] is value for key, value in state.items()):
            return reduced
        return (*reduced[:2], wrapped, *reduced[3:])

    def _rekey(self, inner: _Items) -> None:
        """Keys the memo entry of ``inner`` by its list (unless the list has one already)."""
        memo: dict[int, tuple[int, Any]] = self.memo.copy()  # type: ignore[has-type]
        entry = memo.pop(id(inner), None)
        if entry is None or id(inner.items) in memo:  # the list was pickled before: a reference
            return
        memo[id(inner.items)] = (entry[0], inner.items)
        self.memo = memo  # {id: (index, object)}, copied: O(memo), hence _wrap's bound

    def _wrap(self, value: Any) -> Any:
        """``value`` itself, or its :class:`_Atoms` if it is a big list of strings."""
        if type(value) not in (list, tuple) or len(value) < MIN_ITEMS:
            return value
        known = self._atoms.get(id(value))
        if known is None:  # keep the list: its id stays its own while pickling
            fast = (
                # a memo entry costs a byte of the stream at least: re-keying (copying the
                # memo, ~3 times the time an item saves) would cost less than it saves
                self._file.written + _FRAME < len(value) // 4
                and _types(value) in _ATOMS
                and _distinct(value)
            )
            atoms = _Atoms(value) if fast else value
            known = self._atoms[id(value)] = (atoms, value)
        return known[0]


def dump(obj: Any, file: Any) -> None:
    """Pickle ``obj`` into ``file`` with :class:`Pickler` (cloudpickle's protocol)."""
    Pickler(file, cloudpickle.DEFAULT_PROTOCOL).dump(obj)


def _module_by_name(module: types.ModuleType) -> tuple[Any, tuple[str]] | None:
    """An imported module of a ``ModuleType`` subclass (``torch.classes``), pickled by name.

    cloudpickle pickles plain modules by name, but not these: one reaches a
    function pickled by value whose code reads an attribute of the same name
    (``self.classes`` beside ``torch``), and pickle cannot pickle the object.
    """
    name = getattr(module, "__name__", None)
    if isinstance(name, str) and sys.modules.get(name) is module:
        return importlib.import_module, (name,)
    return None


def dumps(obj: Any) -> bytes:
    """``obj`` pickled with :class:`Pickler`."""
    buffer = io.BytesIO()
    dump(obj, buffer)
    return buffer.getvalue()
