"""Carry a worker's exception to the main process with its origin: worker, block, item."""

from __future__ import annotations

import reprlib
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...datapipes import DataPipe, current_position
from ...datapipes.runtime import RUN_LOOP_CODES, Key, key_position, running_stage
from ...errors import WorkerError
from ...queues import encode

__all__ = ["Failure", "capture_failure", "describe_item", "noted_origin", "unsendable_failure"]

ITEM_REPR_MAX = 120
"""Characters of an item's ``repr`` that an error shows at most."""

_UNKNOWN: Any = object()


@dataclass(frozen=True)
class Failure:
    """A picklable record of an exception raised in a worker."""

    worker: str
    type_name: str
    message: str
    traceback_text: str
    block: str | None
    item: int | None
    exc_class: type | None
    item_repr: str | None = None

    def raise_here(self) -> None:
        """Raise the original exception type in this process, its origin attached.

        The raised exception's message names the worker, block and item and
        includes the worker's traceback; its ``__cause__`` is a
        :class:`~pipeloom.errors.WorkerError` with the same facts as attributes.
        """
        details = f"  {self.origin()}\nOriginal traceback:\n{self.traceback_text.rstrip()}"
        error = WorkerError(
            f"{self.type_name}: {self.message}\n{details}",
            worker=self.worker,
            block=self.block,
            item=self.item,
            original_type=self.type_name,
            traceback_text=self.traceback_text,
            item_repr=self.item_repr,
        )
        rebuilt = _rebuild(self.exc_class, f"{self.message}\n{details}")
        if rebuilt is None:
            raise error
        raise rebuilt from error

    def origin(self) -> str:
        """``"raised in <worker>, block <block>, item at position <p>, item <repr>"``."""
        origin = [self.worker]
        if self.block:
            origin.append(f"block {self.block}")
        if self.item is not None:
            origin.append(f"item at position {self.item}")
        if self.item_repr is not None:
            origin.append(f"item {self.item_repr}")
        return f"raised in {', '.join(origin)}"


def noted_origin(error: Exception, where: str = "the main process") -> Exception:
    """``error``, with a note naming where it was raised, as a worker's error names it.

    For an error caught in ``where`` right where it was raised (the main process
    reads the part before the sharding point for economic/chunked): the
    innermost block on its traceback, the position being produced and that
    block's item, as :func:`capture_failure` finds them. An error from another
    process (one that :meth:`Failure.raise_here` raised) already names its origin.
    """
    if not isinstance(error, WorkerError) and not isinstance(error.__cause__, WorkerError):
        error.add_note(capture_failure(error, where).origin())
    return error


def _rebuild(exc_class: type | None, text: str) -> BaseException | None:
    """``exc_class(text)``, shown as ``text`` (not repr-quoted, as ``KeyError`` would)."""
    if exc_class is None or not issubclass(exc_class, Exception):
        return None
    try:
        rebuilt = exc_class(text)
        if str(rebuilt) == text:
            return rebuilt
        # KeyError (and kin) show their argument's repr: one line, \n escaped. A subclass
        # under the same name shows the text as is, and `except KeyError` still catches it.
        shown = type(
            exc_class.__name__,
            (exc_class,),
            {
                "__str__": lambda self: str(self.args[0]),
                "__module__": exc_class.__module__,
                "__qualname__": exc_class.__qualname__,
            },
        )
        return shown(text)  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001 - an exception class with another signature
        return None


def capture_failure(
    error: BaseException,
    worker: str,
    *,
    block: str | None = None,
    position: int | None = _UNKNOWN,
    item: Any = _UNKNOWN,
) -> Failure:
    """Record ``error`` (raised while producing an item in ``worker``).

    The block, the item's position and the item default to what the
    traceback and the item stamp tell: the innermost block that raised, the
    position being produced, and that block's ``item`` variable.
    """
    exc_class: type | None = type(error)
    if type(error).__module__ == "__main__" or "<locals>" in type(error).__qualname__:
        exc_class = None  # not importable by the receiving process
    found_block, found_item = _failing_frame(error)
    if item is _UNKNOWN:
        item = found_item
    return Failure(
        worker=worker,
        type_name=type(error).__qualname__,
        message=_message(error),
        traceback_text="".join(traceback.format_exception(error)),
        block=block if block is not None else found_block,
        item=current_position() if position is _UNKNOWN else position,
        exc_class=exc_class,
        item_repr=None if item is _UNKNOWN else describe_item(item),
    )


def unsendable_failure(
    error: BaseException, worker: str, block: str, outputs: list[tuple[Key | None, Any, Any]]
) -> Failure:
    """The failure for ``outputs`` (``(key, draws, item)``) that could not be sent.

    Names the first output that cannot cross to another process, its
    position, and the real cause (e.g. ``PayloadError`` for a tensor that
    requires grad, ``TypeError`` for an object holding a lock); ``block`` is
    the block that made the outputs.
    """
    for key, _, item in outputs:
        try:
            encode(item)
        except Exception as cause:  # noqa: BLE001 - this is the output that cannot cross
            position = key_position(key)
            return capture_failure(cause, worker, block=block, position=position, item=item)
    return capture_failure(error, worker, block=block)


def _message(error: BaseException) -> str:
    """The exception's message; a ``KeyError``'s own text, not its repr."""
    if isinstance(error, KeyError) and len(error.args) == 1 and isinstance(error.args[0], str):
        return error.args[0]
    return str(error)


def _failing_frame(error: BaseException) -> tuple[str | None, Any]:
    """``repr`` of the innermost block on the traceback, and its ``item`` variable if any."""
    found = None
    item = _UNKNOWN
    tb = error.__traceback__
    while tb is not None:
        local = tb.tb_frame.f_locals
        candidate = local.get("self")
        if tb.tb_frame.f_code in RUN_LOOP_CODES and tb.tb_next is not None:
            # a fused run called a stage's function itself: the stage's block
            candidate = running_stage(candidate, tb.tb_next.tb_frame.f_code)
        if isinstance(candidate, DataPipe):
            found = candidate
            item = local.get("item", _UNKNOWN)
        tb = tb.tb_next
    if found is None:
        return None, _UNKNOWN
    try:
        return repr(found), item
    except Exception:  # noqa: BLE001 - a block whose repr raises
        return type(found).__name__, item


_SHORT = reprlib.Repr()
_SHORT.maxstring = 60
_SHORT.maxother = 60
_SHORT.maxlevel = 3


def describe_item(item: Any, limit: int = ITEM_REPR_MAX) -> str:
    """A short description of ``item`` for an error: a sample's key, else a bounded repr.

    Never raises, never builds a huge string: a tensor or array is described
    by its shape and dtype, containers are cut short, and the whole is at
    most ``limit`` characters.

    Example:
        >>> describe_item({"__key__": "shard-3/000042", ".jpg": bytes(10**6)})
        "with __key__ 'shard-3/000042'"
        >>> describe_item(list(range(10**6)))
        '[0, 1, 2, 3, 4, 5, ...]'
    """
    try:
        if isinstance(item, Mapping) and "__key__" in item:
            text = f"with __key__ {_SHORT.repr(item['__key__'])}"
        elif _is_array(item):
            text = f"{type(item).__name__}(shape={tuple(item.shape)}, dtype={item.dtype})"
        else:
            text = _SHORT.repr(item)
    except Exception as error:  # noqa: BLE001 - a repr that raises must not hide the failure
        return f"<{type(item).__name__} whose repr raised {type(error).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_array(item: Any) -> bool:
    module = type(item).__module__
    return module.startswith(("torch", "numpy")) and hasattr(item, "shape")
