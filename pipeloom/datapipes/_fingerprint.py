"""What a cache of a pipeline's edge is keyed by: the identity of everything upstream.

:func:`fingerprint` digests the upstream graph of a block: each block's type,
its public attributes (its arguments, by pipeloom's and torchdata's
convention; ``_private`` fields are runtime state and are skipped), the edges,
and the identity of the data the sources read where that is cheap to learn.
The rule for each kind of value:

* plain values (numbers, strings, bytes, None, containers of them, arrays and
  tensors): their contents;
* a string or path naming an existing local file: also its size and
  modification time, so a rewritten input file changes the fingerprint; a file
  lister adds the size and modification time of every file it lists;
* functions and lambdas: their code (bytecode, constants, names), default
  arguments, closure contents and the module globals they read, recursively;
  *not* their file name or line number, so moving code around keeps a snapshot;
  ``functools.partial`` and bound methods by their parts; a builtin method
  bound to data (``some_dict.get``, ``allowed.__contains__``) also by that
  data; other builtins by their qualified names;
* classes (read by a function, or of an object): their qualified name and
  their functions' code; for classes of your own code (not pipeloom's, the
  standard library's or an installed package's) also their class attributes
  (``Config.SCALE``) and those of their own base classes;
* any other object: its type and attributes, recursively, or its ``repr`` when
  the type defines one that carries no memory address;
* an object whose class defines ``__pipeloom_fingerprint__(self)``: what that
  returns (e.g. a call counter or a memo table that does not change the
  output can return a constant);
* anything else (a value that only has an address-bearing ``repr`` and no
  attributes, such as a C extension object) cannot be fingerprinted:
  :class:`UnfingerprintableError` names it; give the cache an explicit ``key``.

Mutable values a function reads (a global list or dict, a closure variable)
count with their contents at the time the cache is built: a global
configuration dict that changes makes a new snapshot, and so does a global
log a function appends to (give such an object ``__pipeloom_fingerprint__``).

What is **not** seen: data behind a URL or a remote file system, files opened
by your functions under names the pipeline does not hold, and the state of
global random generators. Change ``key`` (or delete the snapshot) when those change.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> a = fingerprint(IterableWrapper([1, 2]).map(abs))
    >>> a == fingerprint(IterableWrapper([1, 2]).map(abs))
    True
    >>> a == fingerprint(IterableWrapper([1, 3]).map(abs))
    False
"""

from __future__ import annotations

import builtins
import dis
import enum
import functools
import hashlib
import inspect
import os
import stat
import sys
import sysconfig
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ._base import DataPipe
from ._pipeline import upstream_blocks

__all__ = ["Fingerprint", "UnfingerprintableError", "fingerprint", "random_blocks"]

FORMAT = b"pipeloom-fingerprint-1"
# Attributes that sharding settings change: not part of what a block computes.
_SHARDING_FIELDS = frozenset({"total", "index", "group_size", "num_shards", "shard_index"})
_MAX_PATH = 4096


class UnfingerprintableError(TypeError):
    """A value upstream of a cache has no stable identity to key the cache by."""


@dataclass(frozen=True)
class Fingerprint:
    """The digest of an upstream graph.

    Attributes:
        digest: 32 hex characters; equal digests mean the same upstream.
        blocks: one ``(description, digest)`` per upstream block, the cache's
            input first, so a changed block can be named.
    """

    digest: str
    blocks: tuple[tuple[str, str], ...]

    def changed_blocks(self, other_blocks: list[list[str]] | tuple) -> list[str]:
        """The descriptions of this graph's blocks whose digest is not in ``other_blocks``."""
        seen = {digest for _, digest in other_blocks}
        return [description for description, digest in self.blocks if digest not in seen]


def fingerprint(output: DataPipe, *, key: str | None = None) -> Fingerprint:
    """The fingerprint of ``output`` and everything upstream of it.

    Args:
        output: the block whose output is cached.
        key: use this string instead of looking at the graph (you then promise
            to change it when the upstream changes).

    Raises:
        UnfingerprintableError: naming the block and attribute that cannot be
            fingerprinted.
    """
    if key is not None:
        if not isinstance(key, str) or not key:
            raise TypeError(f"key must be a non-empty str, got {key!r}")
        digest = hashlib.blake2b(FORMAT + b"key:" + key.encode(), digest_size=16).hexdigest()
        return Fingerprint(digest, ((f"key={key!r}", digest),))
    blocks = upstream_blocks(output)
    index = {id(block): i for i, block in enumerate(blocks)}
    total = hashlib.blake2b(FORMAT, digest_size=16)
    described = []
    for i, block in enumerate(blocks):
        block_hash = hashlib.blake2b(digest_size=16)
        _Digester(block_hash, f"block #{i} {type(block).__qualname__}").block(block)
        parents = [index[id(parent)] for parent in block.parents]
        total.update(f"{i}<-{parents}:".encode() + block_hash.digest())
        described.append((f"#{i} {block!r}", block_hash.hexdigest()))
    return Fingerprint(total.hexdigest(), tuple(described))


def random_blocks(output: DataPipe) -> list[DataPipe]:
    """The blocks upstream of ``output`` (itself included) that draw random numbers.

    A block is random when it is one of pipeloom's shuffling blocks or
    ``cycle`` (each round draws new seeds, which ``item_rng()`` uses), declares
    ``randomized = True``, or takes a ``seed`` argument (the convention of
    random blocks). Randomness in your own functions (``item_rng()`` is seen
    while items flow; ``random``/``torch.rand`` are not) is not found here.
    """
    from ._bucketbatch import BucketBatcher
    from ._cycle import Cycler
    from ._in_batch_shuffle import InBatchShuffler
    from ._shuffle import MapShuffler, Shuffler

    known = (Shuffler, MapShuffler, InBatchShuffler, BucketBatcher, Cycler)
    found = []
    for block in upstream_blocks(output):
        declared = getattr(type(block), "randomized", None)
        if declared is None:
            declared = isinstance(block, known) or _takes_seed(type(block))
        if declared:
            found.append(block)
    return found


def _takes_seed(cls: type) -> bool:
    try:
        return "seed" in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


class _Digester:
    """Feeds a stable description of values into a hash (see the module docstring)."""

    def __init__(self, sink: Any, where: str) -> None:
        self.sink = sink
        self.where = where
        self.active: set[int] = set()  # ids being digested: a cycle becomes a marker

    def block(self, block: DataPipe) -> None:
        cls = type(block)
        self.tag(f"{cls.__module__}.{cls.__qualname__}")
        inputs = set(block.inputs)
        for name in sorted(vars(block)):
            if name.startswith("_") or name in inputs or isinstance(getattr(block, name), DataPipe):
                continue
            if name in _SHARDING_FIELDS and block.is_shardable():
                continue
            self.tag(name)
            self.value(getattr(block, name), name)
        from ._listers import Lister

        if isinstance(block, Lister):  # the identity of the files it lists
            for path in block.listing():
                self.tag(path)
                self.file_identity(path)

    def tag(self, text: str) -> None:
        data = text.encode("utf-8", "surrogatepass")
        self.sink.update(len(data).to_bytes(8, "little") + data)

    def file_identity(self, path: str) -> None:
        try:
            info = os.stat(path)
        except (OSError, ValueError):
            return
        if stat.S_ISREG(info.st_mode):
            self.tag(f"file:{info.st_size}:{info.st_mtime_ns}")

    def value(self, value: Any, where: str) -> None:  # noqa: C901 - one branch per kind
        if value is None or isinstance(value, (bool, int, float, complex, enum.Enum)):
            self.tag(f"{type(value).__name__}:{value!r}")
        elif isinstance(value, str):
            self.tag("str:" + value)
            if 0 < len(value) < _MAX_PATH and "\0" not in value and "\n" not in value:
                self.file_identity(value)
        elif isinstance(value, (bytes, bytearray, memoryview)):
            self.tag("bytes")
            self.sink.update(bytes(value))
        elif isinstance(value, os.PathLike):
            self.value(os.fspath(value), where)
        elif isinstance(value, range):
            self.tag(repr(value))
        elif isinstance(value, np.ndarray):
            self.tag(f"ndarray:{value.dtype.str}:{value.shape}")
            self.sink.update(np.ascontiguousarray(value).tobytes())
        elif isinstance(value, np.generic):
            self.tag(f"np:{value.dtype.str}:{value!r}")
        elif isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            self.tag(f"tensor:{tensor.dtype}:{tuple(tensor.shape)}")
            self.sink.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, DataPipe):
            self.tag("block:" + type(value).__qualname__)
        else:
            self.composite(value, where)

    def composite(self, value: Any, where: str) -> None:
        if id(value) in self.active:
            self.tag("cycle")
            return
        self.active.add(id(value))
        try:
            self._composite(value, where)
        finally:
            self.active.discard(id(value))

    def _composite(self, value: Any, where: str) -> None:  # noqa: C901 - one branch per kind
        own = getattr(type(value), "__pipeloom_fingerprint__", None)
        if own is not None and not isinstance(value, type):
            self.tag("own")
            self.value(own(value), where)
        elif isinstance(value, (list, tuple)):
            self.tag(f"{type(value).__name__}:{len(value)}")
            for i, item in enumerate(value):
                self.value(item, f"{where}[{i}]")
        elif isinstance(value, (dict, types.MappingProxyType)):
            self.tag(f"dict:{len(value)}")
            for digest, k, v in sorted((self.digest_of(k, where), k, v) for k, v in value.items()):
                self.tag(digest)
                self.value(v, f"{where}[{k!r}]")
        elif isinstance(value, (set, frozenset)):
            self.tag(f"set:{len(value)}")
            for digest in sorted(self.digest_of(item, where) for item in value):
                self.tag(digest)
        elif isinstance(value, functools.partial):
            self.tag("partial")
            self.value(value.func, where + ".func")
            self.value(value.args, where + ".args")
            self.value(value.keywords, where + ".keywords")
        elif isinstance(value, types.MethodType):
            self.tag("method")
            self.value(value.__func__, where)
            self.value(value.__self__, where + ".__self__")
        elif isinstance(value, types.FunctionType):
            self.function(value, where)
        elif isinstance(value, types.CodeType):
            self.code(value, where)
        elif isinstance(value, (types.BuiltinMethodType, types.MethodWrapperType)) and not (
            value.__self__ is None or isinstance(value.__self__, (types.ModuleType, type))
        ):  # a method bound to data, e.g. some_dict.get or allowed.__contains__: the data too
            self.tag("builtin-method")
            self.named(value)
            self.value(value.__self__, where + ".__self__")
        elif isinstance(value, type):
            self.named(value)
            self.class_body(value, where)
        elif isinstance(value, (types.BuiltinFunctionType, types.ModuleType)) or (
            callable(value) and hasattr(value, "__qualname__") and not hasattr(value, "__dict__")
        ):
            self.named(value)
        else:
            self.instance(value, where)

    def named(self, value: Any) -> None:
        module = getattr(value, "__module__", None) or getattr(
            getattr(value, "__self__", None), "__name__", ""
        )
        name = getattr(value, "__qualname__", None) or getattr(value, "__name__", repr(value))
        self.tag(f"named:{module}.{name}")

    def class_body(self, cls: type, where: str) -> None:
        """What a class holds: its functions' code and, for your own classes (not installed
        libraries'), its constants and its own base classes, e.g. ``Config.SCALE``."""
        if cls.__module__ == "builtins":
            return
        mine = _own_class(cls)
        if mine:
            for base in cls.__bases__:
                if _own_class(base):
                    self.tag("base")
                    self.value(base, f"{where}.__bases__")
        for name, member in sorted(vars(cls).items()):
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if isinstance(member, types.FunctionType):
                self.tag("method:" + name)
                self.composite(member, f"{where}.{name}")
            elif not mine or (name.startswith("__") and name.endswith("__")):
                continue  # __module__, __firstlineno__, ...: where it is, not what it does
            elif isinstance(member, property):
                self.tag("property:" + name)
                self.value((member.fget, member.fset, member.fdel), f"{where}.{name}")
            else:
                self.tag("attribute:" + name)
                try:
                    self.value(member, f"{where}.{name}")
                except UnfingerprintableError:  # a descriptor with no identity: its kind
                    self.tag(type(member).__qualname__)

    def function(self, fn: types.FunctionType, where: str) -> None:
        if _library_code(fn.__module__ or ""):
            # pipeloom's (item_rng) or a library's: its name; its globals hold the state
            # of the library, which running the pipeline changes
            self.named(fn)
            return
        self.tag(f"function:{fn.__module__}.{fn.__qualname__}")
        self.code(fn.__code__, where)
        self.value(fn.__defaults__, where + ".__defaults__")
        self.value(fn.__kwdefaults__, where + ".__kwdefaults__")
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            self.tag("closure:" + name)
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                self.tag("empty")
                continue
            self.value(contents, f"{where} (closure variable {name!r})")
        for name in sorted(_global_names(fn.__code__)):
            if name in fn.__globals__:
                self.tag("global:" + name)
                self.value(fn.__globals__[name], f"{where} (global {name!r})")
            elif not hasattr(builtins, name):
                self.tag("missing-global:" + name)

    def code(self, code: types.CodeType, where: str) -> None:
        self.tag("code")
        self.sink.update(code.co_code)
        self.tag(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)))
        for const in code.co_consts:
            self.value(const, where)

    def instance(self, value: Any, where: str) -> None:
        cls = type(value)
        self.tag(f"object:{cls.__module__}.{cls.__qualname__}")
        if cls.__module__ != "builtins":  # what its methods do, e.g. a callable's __call__
            self.composite(cls, f"{where}.__class__")
        has_state = hasattr(value, "__dict__")
        state: dict[str, Any] = getattr(value, "__dict__", None) or {}
        slots = [s for k in cls.__mro__ for s in getattr(k, "__slots__", ())]
        if has_state or slots:
            for name in sorted(state):
                self.tag(name)
                self.value(state[name], f"{where}.{name}")
            for name in sorted(set(slots) - set(state)):
                if hasattr(value, name):
                    self.tag(name)
                    self.value(getattr(value, name), f"{where}.{name}")
            return
        text = repr(value)
        if cls.__repr__ is not object.__repr__ and " at 0x" not in text:
            self.tag("repr:" + text)
            return
        raise UnfingerprintableError(
            f"cannot fingerprint {self.where}, attribute {where}: a {cls.__qualname__} has "
            f"no attributes and no stable repr ({text[:80]}), so a change to it could not "
            f"be seen; pass key='a-name-you-change-when-the-upstream-changes' to the cache "
            f"to key it yourself"
        )

    def digest_of(self, value: Any, where: str) -> str:
        sink = hashlib.blake2b(digest_size=16)
        inner = _Digester(sink, self.where)
        inner.active = self.active
        inner.value(value, where)
        return sink.hexdigest()


@functools.cache
def _library_folders() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(
        os.path.join(os.path.realpath(paths[k]), "")
        for k in ("stdlib", "platstdlib", "purelib", "platlib")
        if k in paths
    )


def _own_class(cls: type) -> bool:
    """A class of the program's own code: not builtins, pipeloom or an installed library."""
    return _own_module(cls.__module__ or "")


def _library_code(module: str) -> bool:
    """Code of pipeloom, the standard library or an installed package (not the program's
    own, nor code run without a module file: ``exec``, a notebook's cells)."""
    if module in ("builtins", "pipeloom") or module.startswith("pipeloom."):
        return True
    file = getattr(sys.modules.get(module), "__file__", None)
    return isinstance(file, str) and os.path.realpath(file).startswith(_library_folders())


def _own_module(module: str) -> bool:
    """A module of the program's own code: not builtins, pipeloom or an installed library."""
    if module in ("builtins", "pipeloom") or module.startswith("pipeloom."):
        return False
    file = getattr(sys.modules.get(module), "__file__", None)
    if not isinstance(file, str):
        return module == "__main__"
    return not os.path.realpath(file).startswith(_library_folders())


def _global_names(code: types.CodeType) -> set[str]:
    """Names a code object (and the code nested in it) reads as globals."""
    names = set()
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            names.add(instruction.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names
