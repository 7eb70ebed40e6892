"""One local helper: the same output in-process, in threads and in processes.

The ``restructure`` branch adds ``pipeloom.testing.check_same_output_everywhere``;
the torchdata-name tests use this small copy until the lead switches them over.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from pipeloom import DataLoader
from pipeloom.datapipes import IterDataPipe
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)


def check_same_output_everywhere(
    make_pipe: Callable[[], IterDataPipe], *, seed: int = 0, epochs: int = 2
) -> list[list[Any]]:
    """Run ``epochs`` epochs in-process, with 2 threads and with 2 processes; compare.

    The pipeline must have a sharding point (``sharding_filter()`` or a
    shardable opener). Returns the in-process epochs.
    """
    expected = _epochs(make_pipe(), InProcessReadingService(), seed, epochs)
    for service in (
        ThreadReadingService(2),
        MultiProcessingReadingService(2, start_method="fork", timeout=60),
    ):
        got = _epochs(make_pipe(), service, seed, epochs)
        assert got == expected, f"{service!r} differs from in-process:\n{got!r}\n{expected!r}"
    return expected


def _epochs(pipe: IterDataPipe, service: Any, seed: int, epochs: int) -> list[list[Any]]:
    with DataLoader(pipe, service, seed=seed) as loader:
        result = [list(loader) for _ in range(epochs)]
    del loader
    gc.collect()  # what a loader leaves to the garbage collector must not reach the next test
    return result
