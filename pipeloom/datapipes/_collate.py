"""``collate``: turn each batch into tensors; and ``default_collate``.

``default_collate`` delegates to ``torch.utils.data.default_collate`` -- the
ecosystem's convention, so a batch looks exactly as it does with torch's
``DataLoader`` (tensors and NumPy arrays are stacked, numbers become tensors,
strings stay lists, dicts/tuples/lists/namedtuples are collated per field).
What it adds: when the samples cannot be stacked, the error names the field
(e.g. ``sample['image']``) and the differing shapes or lengths; and in a
worker process, tensors are stacked straight into the shared memory of the
queue the batch leaves by (:func:`empty_output`), so it crosses to the main
process without a copy -- what torch's workers do with ``_new_shared``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data
import torch.utils.data._utils.collate as torch_collate

from ._base import IterDataPipe
from ._context import collates_into_buffers, collating_into, current_position, empty_output
from ._map import check_callable, fn_name, raise_with_note
from ._warm import WarmBuffers

__all__ = ["Collator", "default_collate"]


def default_collate(batch: Sequence[Any]) -> Any:
    """Collate a batch (a sequence of samples) as torch's ``default_collate`` does.

    Raises:
        RuntimeError: samples whose tensors/arrays differ in shape, or whose
            lists differ in length; the message names the field and the shapes.
        TypeError: a field of a type torch cannot collate (e.g. None), named.
        KeyError: a key of the first sample missing from a later one, named
            with the entry (torch's own says only the key).

    Example:
        >>> default_collate([{"x": 1, "y": "a"}, {"x": 2, "y": "b"}])
        {'x': tensor([1, 2]), 'y': ['a', 'b']}
    """
    numbers = _collate_numbers(batch)
    if numbers is not None:
        return numbers
    try:
        if collates_into_buffers():
            return torch_collate.collate(batch, collate_fn_map=_into_output_map())
        return torch.utils.data.default_collate(batch)  # type: ignore[arg-type]
    except (RuntimeError, TypeError, KeyError) as error:
        problem = _diagnose(list(batch), "sample") if _is_sequence(batch) and len(batch) else None
        if problem is None:
            raise
        raise type(error)(
            f"default_collate cannot collate the batch: {problem}. Make the samples "
            f"uniform before batching (e.g. pad or resize in a .map), or pass "
            f"collate_fn= to .collate() (torch said: {error})"
        ) from error


def _stack_into_output(batch: Sequence[torch.Tensor], **_: Any) -> torch.Tensor:
    """torch's tensor collation, stacking into :func:`empty_output` memory."""
    first = batch[0]
    if first.is_nested or first.layout != torch.strided or first.device.type != "cpu":
        return torch_collate.collate_tensor_fn(batch)  # torch's errors and devices
    out = None
    if all(sample.dtype == first.dtype and not sample.requires_grad for sample in batch):
        out = empty_output((len(batch), *first.shape), first.dtype)
    return torch.stack(list(batch), 0, out=out)


def _into_output_map() -> dict[Any, Callable[..., Any]]:
    """torch's ``default_collate_fn_map`` as it is now, tensors stacked into the output.

    Read at each batch, not once at import: a user registers collate
    functions for their own types in torch's map (``default_collate_fn_map[Box]
    = collate_box``), and torch's ``default_collate`` honours them in its
    worker processes as in the main process. A tensor function the user put
    there is kept too.
    """
    current = torch_collate.default_collate_fn_map
    if current.get(torch.Tensor) is not torch_collate.collate_tensor_fn:
        return current
    return {**current, torch.Tensor: _stack_into_output}


def _collate_numbers(batch: Sequence[Any]) -> torch.Tensor | None:
    """A batch of Python numbers through NumPy: the same tensor as torch makes, sooner.

    torch turns ints (and bools) into ``torch.tensor(batch)`` and floats into
    float64; NumPy builds the same array from a list faster. Only a list of
    one exact type takes this path: NumPy would also read ``None`` as NaN and
    ``"3.5"`` as 3.5 where torch refuses them, so anything else (mixed types,
    subclasses, huge ints) returns None: torch decides.
    """
    if type(batch) is not list or not batch or (kind := type(batch[0])) not in _NUMBER_DTYPES:
        return None
    if set(map(type, batch)) != {kind} or not _torch_collates_as_its_own(kind):
        return None
    try:
        array: np.ndarray = np.array(batch, dtype=_NUMBER_DTYPES[kind])
    except OverflowError:  # an int beyond int64: torch's error
        return None
    return torch.from_numpy(array)


_NUMBER_DTYPES: dict[type, type] = {float: np.float64, int: np.int64, bool: np.bool_}
_TORCH_NUMBER_FNS: dict[type, Any] = {
    float: torch_collate.collate_float_fn,
    int: torch_collate.collate_int_fn,
    bool: torch_collate.collate_int_fn,  # torch finds int's function for a bool
}


def _torch_collates_as_its_own(kind: type) -> bool:
    """True when torch's ``default_collate_fn_map`` still collates ``kind`` with its own function.

    A user may register another one (``default_collate_fn_map[float] = to_float32``):
    torch then calls it, so the fast path must not decide.
    """
    current = torch_collate.default_collate_fn_map
    fn = current.get(kind)
    if fn is None:  # torch's collate then takes the first entry kind is a subclass of
        fn = next((f for key, f in current.items() if issubclass(kind, key)), None)
    return fn is _TORCH_NUMBER_FNS[kind]


def check_conversion(conversion: Any) -> Callable[[Any], Any] | None:
    """torchdata's ``collate(conversion)``: a callable is the collate function.

    Its other form, a dict of per-column functions, was for TorchArrow
    DataFrames (gone), and is refused with how to port it.
    """
    if conversion is None or conversion is torch.utils.data.default_collate:
        return None
    if isinstance(conversion, Mapping):
        raise TypeError(
            "collate(conversion={column: fn}) applied to TorchArrow DataFrames, which "
            "pipeloom does not have; collate dict samples with the default collate_fn, or "
            "pass collate_fn=lambda batch: {k: fn(...) ...} built from your conversions"
        )
    return conversion


class Collator(IterDataPipe):
    """Apply ``collate_fn`` to each batch (functional name: ``collate``).

    Args:
        source: a block yielding batches (e.g. ``.batch(n)``).
        collate_fn: ``batch -> collated batch``; ``None`` uses :func:`default_collate`.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> batches = list(IterableWrapper([(0, 1.0), (1, 2.0), (2, 3.0)]).batch(2).collate())
        >>> batches[0]
        [tensor([0, 1]), tensor([1., 2.], dtype=torch.float64)]
    """

    inputs = ("source",)
    per_item = True
    one_to_one = True

    def __init__(
        self, source: IterDataPipe, collate_fn: Callable[[Any], Any] | None = None
    ) -> None:
        if collate_fn is not None:
            check_callable(collate_fn, "collate_fn", "collate", 1)
        self.source = source
        self.collate_fn = collate_fn
        self._collate = default_collate if collate_fn is None else collate_fn

    def async_next(self) -> Any:
        try:
            batch = self.source.async_next()
        except StopIteration:
            self._warm_buffers().clear()  # a loader at rest holds no batch memory
            raise
        previous = collating_into(self._warm_buffers())
        try:
            return self._collate(batch)
        except Exception as error:
            raise_with_note(error, self, current_position())
        finally:
            collating_into(previous)

    def _warm_buffers(self) -> WarmBuffers:
        warm = self.__dict__.get("_warm")
        if warm is None:
            warm = self._warm = WarmBuffers()
        return warm

    def reset(self) -> None:
        self._warm_buffers().clear()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_warm", None)  # memory of this process only
        return state

    def __len__(self) -> int:
        return len(self.source)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        name = "default_collate" if self.collate_fn is None else fn_name(self.collate_fn)
        return f"Collator(collate_fn={name})"


_LEAF_TYPES = (torch.Tensor, np.ndarray, np.generic, int, float, complex, str, bytes)


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _diagnose(samples: list[Any], path: str) -> str | None:
    """Describe the first field where the samples cannot be collated, or None."""
    first = samples[0]
    if isinstance(first, (torch.Tensor, np.ndarray)):
        return _differ(path, "shape", [_shape(sample) for sample in samples])
    if isinstance(first, _LEAF_TYPES):
        return None
    if isinstance(first, Mapping):
        for key in first:
            for index, sample in enumerate(samples):
                if not isinstance(sample, Mapping) or key not in sample:
                    return f"{path}[{key!r}] is missing from entry {index}"
            found = _diagnose([s[key] for s in samples], f"{path}[{key!r}]")
            if found is not None:
                return found
        return None
    if _is_sequence(first):
        lengths = [len(s) if _is_sequence(s) else None for s in samples]
        found = _differ(path, "length", lengths)
        if found is not None:
            return found
        for position in range(len(first)):
            found = _diagnose([s[position] for s in samples], f"{path}[{position}]")
            if found is not None:
                return found
        return None
    return f"{path} is a {type(first).__name__}, which has no tensor form"


def _shape(value: Any) -> Any:
    """A sample's shape; a nested tensor has none (asking raises), so "nested"."""
    if isinstance(value, torch.Tensor) and value.is_nested:
        return "nested"
    return tuple(getattr(value, "shape", ()))


def _differ(path: str, what: str, values: list[Any]) -> str | None:
    for index, value in enumerate(values):
        if value != values[0]:
            return (
                f"{path} has {what} {values[0]} in entry 0 but {what} {value} in entry "
                f"{index} (all {what}s: {_summary(values)})"
            )
    return None


def _summary(values: list[Any]) -> str:
    distinct: dict[Any, int] = {}
    for value in values:
        distinct[value] = distinct.get(value, 0) + 1
    return ", ".join(f"{value} x{count}" for value, count in distinct.items())
