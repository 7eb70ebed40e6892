"""Pinning and device copies, prepared in a thread one batch ahead of the consumer.

``PinMemory`` and ``ToDevice`` are :class:`Prefetcher` blocks whose thread also
prepares each item, so the copy of batch k+1 overlaps the model's work on batch
k. They run in the main process (``per_item`` stays False). See docs/device.md.
"""

from __future__ import annotations

import collections.abc
import copy
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple, TypeAlias

import torch
from torch.utils.data._utils.pin_memory import pin_memory as _pin_structure

from .._validate import check_bool
from ._base import IterDataPipe
from ._prefetch import _STOPPED, Prefetcher, _Worker
from ._state_fields import StateFields

__all__ = ["PinMemory", "ToDevice"]

Device = str | torch.device | int  # an int is a CUDA index
_Copier: TypeAlias = "_PinCopier | _DeviceCopier"


class _DeviceBlock(Prefetcher):
    """A prefetcher whose thread passes each item through ``copier``."""

    inputs = ("source",)

    def __init__(self, source: IterDataPipe, copier: _Copier, buffer_size: int) -> None:
        super().__init__(source, buffer_size)
        self._copier = copier

    def async_next(self) -> Any:
        if self._worker is None:
            self._start_paused()  # Prefetcher's async_next then starts this worker
        return super().async_next().deliver()

    def _start_paused(self) -> _Worker:
        self._copier.bind()
        worker = _CopyWorker(self.source, self.buffer_size, self._signal, repr(self), self._copier)
        self._worker = worker
        self._finalizer = weakref.finalize(self, worker.stop)
        return worker

    def state_dict(self) -> dict[str, Any]:
        """Pause the thread; save the buffered items as host (CPU) data."""
        state = super().state_dict()
        items = [(ready.to_host(), stamp) for ready, stamp in state["items"]]
        return {"items": items, "ended": state["ended"]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Prepare the saved items again (pin / copy them) before the thread restarts."""
        fields = StateFields(self, state)
        held, ended = fields.stamped_items("items"), fields.bool("ended")
        self._copier.bind()
        items = [(self._copier(item), stamp) for item, stamp in held]
        super().load_state_dict({"items": items, "ended": ended})


class PinMemory(_DeviceBlock):
    """Copy tensors into pinned (page-locked) host memory, ahead, in a thread.

    Functional: ``pin_memory``. Items are walked by ``torch.utils.data``'s own
    ``pin_memory`` (dicts, lists, tuples, namedtuples, objects with a
    ``pin_memory()`` method). Without CUDA, or for ``device="cpu"``, items pass
    through unchanged (still ``buffer_size`` ahead). The state holds the buffer.

    Args:
        source: the upstream block.
        device: the CUDA device the memory is pinned for (``None``: the current
            one when CUDA is available), or ``"cpu"`` for a pass-through.
        buffer_size: items prepared ahead (2: double buffering).
        pin_memory_fn: ``pin_memory_fn(item, device)`` pins one item, instead
            of torch's walk (torchdata's argument); called only with CUDA.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> batches = [{"x": torch.ones(2)}, {"x": torch.zeros(2)}]
        >>> [b["x"].tolist() for b in PinMemory(IterableWrapper(batches))]
        [[1.0, 1.0], [0.0, 0.0]]
    """

    per_rank_fields = ("buffer_size", "device")

    def __init__(
        self,
        source: IterDataPipe,
        device: Device | None = None,
        buffer_size: int = 2,
        *,
        pin_memory_fn: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        self.device = None if device is None else _check_device(device, "pin_memory")
        if pin_memory_fn is not None and not callable(pin_memory_fn):
            raise TypeError(
                f"pin_memory_fn must be a callable (item, device) -> pinned item, got "
                f"{type(pin_memory_fn).__name__}"
            )
        self.pin_memory_fn = pin_memory_fn
        cuda = torch.device("cuda") if torch.cuda.is_available() else None
        copier = _PinCopier(cuda if device is None else self.device, pin_memory_fn)
        super().__init__(source, copier, buffer_size)

    def __repr__(self) -> str:
        device = None if self.device is None else str(self.device)
        return f"PinMemory(device={device!r}, buffer_size={self.buffer_size})"


class ToDevice(_DeviceBlock):
    """Move tensors to ``device``, ahead, in a thread (functional: ``to_device``).

    Dicts, lists, tuples and namedtuples are rebuilt with each tensor moved;
    other leaves pass through. On CUDA the thread pins (when ``non_blocking``)
    and copies on a stream of its own, then records an event; the consumer's
    current stream waits on it and ``record_stream``s each tensor, so memory is
    not reused early. The state holds the buffered items copied back to the CPU.

    Args:
        source: the upstream block.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device`` or a
            CUDA index.
        non_blocking: copy asynchronously from pinned memory (CUDA only).
        buffer_size: items copied ahead (2: double buffering).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> out = list(ToDevice(IterableWrapper([(torch.ones(2), "a")]), "cpu"))
        >>> out[0][0].device, out[0][1]
        (device(type='cpu'), 'a')
    """

    per_rank_fields = ("buffer_size", "device", "non_blocking")

    def __init__(
        self, source: IterDataPipe, device: Device, non_blocking: bool = True, buffer_size: int = 2
    ) -> None:
        check_bool(
            "non_blocking",
            non_blocking,
            hint="use non_blocking=True to overlap copies with compute",
        )
        self.device = _check_device(device, "to_device")
        self.non_blocking = non_blocking
        super().__init__(source, _DeviceCopier(self.device, non_blocking), buffer_size)

    def __repr__(self) -> str:
        return (
            f"ToDevice(device={str(self.device)!r}, non_blocking={self.non_blocking}, "
            f"buffer_size={self.buffer_size})"
        )


def _check_device(device: Any, what: str) -> torch.device:
    """``device`` as a ``torch.device`` that exists on this machine, or a clear error."""
    if isinstance(device, bool) or not isinstance(device, (str, torch.device, int)):
        raise TypeError(
            f"{what} device must be a str, torch.device or int (a CUDA index), got "
            f"{type(device).__name__} {device!r}; write e.g. device='cuda:0' or device='cpu'"
        )
    if isinstance(device, int) and device < 0:
        raise ValueError(f"{what} device index must be >= 0, got {device}; e.g. 0 is 'cuda:0'")
    try:
        target = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except RuntimeError as error:
        raise ValueError(
            f"{what}(device={device!r}): torch does not know this device ({error}); "
            f"use 'cpu', 'cuda' or 'cuda:<index>'"
        ) from None
    if target.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"{what}(device={device!r}) needs CUDA, but torch.cuda.is_available() is "
                f"False on this machine; use 'cpu', or run on a machine with a GPU"
            )
        count = torch.cuda.device_count()
        if target.index is not None and target.index >= count:
            raise ValueError(
                f"{what}(device={device!r}) asks for CUDA device {target.index}, but this "
                f"machine has {count} (indices 0..{count - 1}); use an index below {count}"
            )
    elif target.type != "cpu":
        raise ValueError(
            f"{what}(device={device!r}): only 'cpu' and 'cuda' devices are supported, got "
            f"{target.type!r}; for another device, move batches with .map(...) instead"
        )
    return target


class _Ready(NamedTuple):
    """A prepared item; on CUDA also the event its copy recorded and its tensors."""

    data: Any
    event: Any = None
    tensors: list[torch.Tensor] = []

    def deliver(self) -> Any:
        """The data, safe to use on the calling thread's current CUDA stream."""
        if self.event is not None and self.tensors:
            stream = torch.cuda.current_stream(self.tensors[0].device)
            stream.wait_event(self.event)
            for tensor in self.tensors:
                tensor.record_stream(stream)
        return self.data

    def to_host(self) -> Any:
        """The data with device tensors copied back to the CPU (for a state dict)."""
        if self.event is not None:
            self.event.synchronize()
        return apply_to_tensors(self.data, lambda t: t.to("cpu"))


def _bind(device: Any) -> Any:
    """Give ``"cuda"`` the index of the calling (consumer) thread's current device."""
    if device is not None and device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


class _PinCopier:
    """What the thread does to each item (``bind`` runs in the consumer's thread)."""

    def __init__(
        self, device: torch.device | None, pin_fn: Callable[[Any, Any], Any] | None = None
    ) -> None:
        self.device = device if device is not None and device.type == "cuda" else None
        self.pin_fn = pin_fn

    def bind(self) -> None:
        self.device = _bind(self.device)

    def __call__(self, item: Any) -> _Ready:
        if self.device is None:  # no CUDA: pinning would only warn
            return _Ready(item)
        with torch.cuda.device(self.device):
            if self.pin_fn is not None:
                return _Ready(self.pin_fn(item, self.device))
            return _Ready(_pin_structure(item))


class _DeviceCopier:
    def __init__(self, device: torch.device, non_blocking: bool) -> None:
        self.device, self.non_blocking = device, non_blocking
        self._stream: torch.cuda.Stream | None = None  # made in the thread, never pickled

    def bind(self) -> None:
        self.device = _bind(self.device)

    def __call__(self, item: Any) -> _Ready:
        if self.device.type == "cpu":  # a no-op for CPU tensors
            return _Ready(apply_to_tensors(item, lambda t: t.to(self.device)))
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        stream = self._stream
        moved: list[torch.Tensor] = []

        def move(tensor: torch.Tensor) -> torch.Tensor:
            if tensor.device.type == "cpu" and self.non_blocking:
                tensor = tensor.pin_memory()
            elif tensor.is_cuda and tensor.device != self.device:  # peer copy: wait for it
                stream.wait_stream(torch.cuda.current_stream(tensor.device))
            moved.append(tensor.to(self.device, non_blocking=self.non_blocking))
            return moved[-1]

        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            data = apply_to_tensors(item, move)
            event = torch.cuda.Event()
            event.record(stream)
        return _Ready(data, event, moved)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_stream": None}


class _CopyWorker(_Worker):
    """The prefetch thread, preparing each item right after pulling it."""

    def __init__(self, source, buffer_size, signal, owner, copier: _Copier) -> None:
        super().__init__(source, buffer_size, signal, owner)
        self.copier = copier

    def _pull(self) -> Any:
        item = super()._pull()
        return item if item is _STOPPED else self.copier(item)


def apply_to_tensors(data: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``data`` rebuilt with ``fn`` applied to each tensor, walked like torch's ``pin_memory``.

    Mappings, namedtuples, tuples and sequences are rebuilt, keeping their type where
    possible; strings, bytes and other leaves are returned as they are.

    >>> apply_to_tensors({"a": [torch.ones(1)], "b": "s"}, lambda t: t * 2)
    {'a': [tensor([2.])], 'b': 's'}
    """
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, (str, bytes, bytearray)):
        return data
    if isinstance(data, collections.abc.Mapping):
        mapping = {key: apply_to_tensors(value, fn) for key, value in data.items()}
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)  # keeps the type and its extra attributes
                clone.update(mapping)
                return clone
            return type(data)(mapping)  # type: ignore[call-arg]
        except TypeError:
            return mapping
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):  # namedtuple
            return type(data)(*(apply_to_tensors(value, fn) for value in data))
        return type(data)(apply_to_tensors(value, fn) for value in data)
    if isinstance(data, collections.abc.Sequence):
        values = [apply_to_tensors(value, fn) for value in data]
        try:
            if isinstance(data, collections.abc.MutableSequence):
                mutable = copy.copy(data)
                for index, value in enumerate(values):
                    mutable[index] = value
                return mutable
            return type(data)(values)  # type: ignore[call-arg]
        except TypeError:
            return values
    return data
