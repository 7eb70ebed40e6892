"""torch's ``DataLoader`` argument checks, with messages that say expected / got / fix."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import numbers
from typing import Any

import torch
import torch.utils.data

__all__ = [
    "FIXED_BY_TORCH",
    "REBUILT_BY_TORCH",
    "ITERABLE_STRATEGY",
    "MAP_STYLE_STRATEGY",
    "STRATEGIES",
    "WORKER_TYPES",
    "check_dataset_args",
    "check_worker_args",
    "refuse_change",
    "resolve_strategy",
    "service_strategy_kwargs",
    "start_method_of",
]

STRATEGIES = ("classic", "economic", "chunked")
WORKER_TYPES = ("process", "thread")

#: The strategy map-style datasets run under when ``strategy`` is not given: torch's
#: design (each worker builds whole batches, seeded as torch seeds it).
MAP_STYLE_STRATEGY = "classic"
#: Iterable datasets are read by a copy in each worker, as torch does.
ITERABLE_STRATEGY = "classic"


def check_worker_args(
    *,
    num_workers: Any,
    timeout: Any,
    prefetch_factor: Any,
    persistent_workers: bool,
    worker_init_fn: Any,
    multiprocessing_context: Any,
    worker_type: Any,
    generator: Any,
) -> None:
    """Validate the arguments about workers (torch's checks, plus ours)."""
    if (
        isinstance(num_workers, bool)
        or not isinstance(num_workers, numbers.Integral)  # np.int64 too, as torch
        or int(num_workers) < 0
    ):
        raise ValueError(
            f"num_workers must be an int >= 0, got {num_workers!r}; use num_workers=0 to "
            f"load in the calling thread"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(
            f"timeout must be a number of seconds >= 0, got {timeout!r}; 0 waits as long "
            f"as the workers live"
        )
    if timeout > 0 and num_workers == 0:
        raise ValueError(
            f"timeout={timeout!r} bounds the wait for a worker, but num_workers=0 loads in "
            f"the calling thread; pass timeout=0 or num_workers > 0"
        )
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError(
            f"prefetch_factor={prefetch_factor!r} counts batches each worker prepares ahead, "
            f"but num_workers=0 starts no worker; set num_workers > 0 or prefetch_factor=None"
        )
    if prefetch_factor is not None and (
        isinstance(prefetch_factor, bool)
        or not isinstance(prefetch_factor, numbers.Integral)
        or prefetch_factor < 1
    ):
        raise ValueError(
            f"prefetch_factor must be an int >= 1 (batches each worker prepares ahead) or "
            f"None for the default 2, got {prefetch_factor!r}"
        )
    if persistent_workers and num_workers == 0:
        raise ValueError(
            "persistent_workers=True keeps worker processes alive between epochs, but "
            "num_workers=0 starts none; set num_workers > 0 or persistent_workers=False"
        )
    if worker_init_fn is not None and not callable(worker_init_fn):
        raise TypeError(
            f"worker_init_fn must be a callable taking the worker id, got "
            f"{type(worker_init_fn).__name__} {worker_init_fn!r}"
        )
    if worker_type not in WORKER_TYPES:
        raise ValueError(f"worker_type must be one of {WORKER_TYPES}, got {worker_type!r}")
    if multiprocessing_context is not None:
        if num_workers == 0:
            raise ValueError(
                f"multiprocessing_context={multiprocessing_context!r} picks how worker "
                f"processes start, but num_workers=0 starts none; set num_workers > 0 or "
                f"multiprocessing_context=None"
            )
        start_method_of(multiprocessing_context)  # raises on a bad value
    if worker_type == "thread" and int(num_workers) > 0:
        for name, value in (
            ("worker_init_fn", worker_init_fn),
            ("multiprocessing_context", multiprocessing_context),
        ):
            if value is not None:
                raise ValueError(
                    f"{name} applies to worker processes, but worker_type='thread' runs "
                    f"the workers as threads of this process; drop {name} or use "
                    f"worker_type='process'"
                )
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator or None, got {type(generator).__name__}; "
            f"pass e.g. torch.Generator().manual_seed(0)"
        )


def start_method_of(context: Any) -> str | None:
    """The start method a ``multiprocessing_context`` (a name or a context) names."""
    if context is None:
        return None
    if isinstance(context, str):
        valid = multiprocessing.get_all_start_methods()
        if context not in valid:
            raise ValueError(
                f"multiprocessing_context must be a start method in {valid} or a "
                f"multiprocessing context, got {context!r}"
            )
        return context
    if isinstance(context, multiprocessing.context.BaseContext):
        return context.get_start_method()
    raise TypeError(
        f"multiprocessing_context must be a start method name such as 'spawn' or a "
        f"context from multiprocessing.get_context(), got {type(context).__name__} {context!r}"
    )


def check_dataset_args(
    *,
    iterable: bool,
    batch_size: Any,
    shuffle: Any,
    sampler: Any,
    batch_sampler: Any,
    drop_last: bool,
) -> None:
    """torch's checks of the sampling arguments, in torch's order."""
    if iterable:
        if shuffle not in (False, None):
            raise ValueError(
                f"shuffle={shuffle!r} cannot reorder an IterableDataset: its __iter__ decides "
                f"the order. Shuffle inside the dataset, or leave shuffle unset"
            )
        for name, value in (("sampler", sampler), ("batch_sampler", batch_sampler)):
            if value is not None:
                raise ValueError(
                    f"{name}={value!r} cannot pick items of an IterableDataset, which has no "
                    f"indices; leave {name} unset, or use a map-style Dataset"
                )
    if sampler is not None and shuffle:
        raise ValueError(
            "sampler and shuffle=True both decide the order; pass one of them (e.g. "
            "sampler=RandomSampler(dataset) instead of shuffle=True)"
        )
    if batch_sampler is not None:
        clashing = [
            name
            for name, clash in (
                ("batch_size", batch_size != 1),
                ("shuffle", bool(shuffle)),
                ("sampler", sampler is not None),
                ("drop_last", bool(drop_last)),
            )
            if clash
        ]
        if clashing:
            raise ValueError(
                f"batch_sampler decides the batches, so it is mutually exclusive with "
                f"batch_size, shuffle, sampler and drop_last; got "
                f"{', '.join(clashing)} too. Drop them, or build the batch sampler with them"
            )
    elif batch_size is None and drop_last:
        raise ValueError(
            "batch_size=None turns off batching, so there is no last batch to drop; pass "
            "drop_last=False or a batch_size"
        )


def service_strategy_kwargs(
    strategy: str, num_batch_workers: int | None, chunk_size: int | None
) -> dict[str, Any]:
    """The strategy arguments to pass to ``MultiProcessingReadingService``.

    Example:
        >>> service_strategy_kwargs("chunked", None, 4)
        {'strategy': 'chunked', 'chunk_size': 4}
    """
    kwargs: dict[str, Any] = {"strategy": strategy}
    if num_batch_workers is not None:
        kwargs["num_batch_workers"] = num_batch_workers
    if chunk_size is not None:
        kwargs["chunk_size"] = chunk_size
    return kwargs


def resolve_strategy(
    strategy: str | None, iterable: bool, worker_type: str, num_workers: int
) -> str:
    """The strategy to run: ``strategy``, or the default for the dataset's style."""
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES} or None, got {strategy!r}")
    if iterable:
        if strategy not in (None, ITERABLE_STRATEGY):
            raise ValueError(
                f"strategy={strategy!r} splits the work of a map-style dataset by index, "
                f"but an IterableDataset is read whole by each worker (torch's design); "
                f"use strategy='classic' or leave it unset"
            )
        return ITERABLE_STRATEGY
    if strategy not in (None, "classic") and (worker_type == "thread" or num_workers == 0):
        raise ValueError(
            f"strategy={strategy!r} is a way to split work across worker processes; "
            f"with {'num_workers=0' if num_workers == 0 else 'worker_type=thread'} "
            f"leave strategy unset"
        )
    return strategy or MAP_STYLE_STRATEGY


REBUILT_BY_TORCH = (
    "collate_fn",
    "num_workers",
    "prefetch_factor",
    "pin_memory",
    "pin_memory_device",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "in_order",
    "strategy",
    "num_batch_workers",
    "chunk_size",
    "worker_type",
)
"""Arguments torch's loader reads again at each ``iter()`` (without persistent workers)."""


FIXED_BY_TORCH = (
    "batch_size",
    "batch_sampler",
    "sampler",
    "drop_last",
    "dataset",
    "persistent_workers",
)
"""Arguments torch's loader refuses to change after construction."""


def refuse_change(name: str, value: Any, current: Any) -> None:
    """Raise when a loader argument fixed at construction is assigned another value.

    torch refuses :data:`FIXED_BY_TORCH` too; it reads :data:`REBUILT_BY_TORCH`
    again at its next ``iter()``, where the compat loader built its pipeline
    and workers from the first value (a change would be ignored, silently).
    """
    fixed = name in FIXED_BY_TORCH
    if value is current or not (fixed or name in REBUILT_BY_TORCH):
        return
    if fixed:
        raise ValueError(
            f"{name} cannot be changed after the DataLoader was built (as in torch); "
            f"build a new DataLoader with {name}={value!r}"
        )
    raise ValueError(
        f"{name} cannot be changed after pipeloom.compat.DataLoader was built: it builds "
        f"its pipeline and workers from {name} once (torch's loader, without persistent "
        f"workers, reads it again at the next iter()), so the change would be ignored; "
        f"build a new DataLoader with {name}={value!r}"
    )
