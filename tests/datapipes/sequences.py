"""Helpers for the tests of the sequence blocks (pack, concat_then_split, padding)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def plain(value: Any) -> Any:
    """Tensors and arrays as nested lists, so outputs compare with ``==``."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.tolist()
    if isinstance(value, dict):
        return {key: plain(v) for key, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(plain(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def numbered_sequences(lengths: list[int], start: int = 1) -> list[list[int]]:
    """Sequences of the given lengths whose tokens are distinct, increasing ints."""
    out, token = [], start
    for length in lengths:
        out.append(list(range(token, token + length)))
        token += length
    return out


def segments_of(values: list, segment_ids: list[int]) -> list[list]:
    """The tokens of each segment of one row, in order (padding left out)."""
    found: dict[int, list] = {}
    for value, segment in zip(values, segment_ids):
        if segment:
            found.setdefault(segment, []).append(value)
    return [found[k] for k in sorted(found)]


def check_services_and_elastic_resume(build, *, seed: int = 0) -> None:
    """``build()`` gives the in-process epochs under threads and processes, and a
    checkpoint taken halfway with 2 workers resumes with 3 (threads and processes)."""
    import pickle

    from pipeloom import DataLoader
    from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService

    with DataLoader(build(), seed=seed) as loader:
        expected = (plain(list(loader)), plain(list(loader)))
    services = {
        "threads": ThreadReadingService,
        "processes": lambda n: MultiProcessingReadingService(n, timeout=60),
    }
    for name, make in services.items():
        with DataLoader(build(), make(2), seed=seed) as loader:
            assert (plain(list(loader)), plain(list(loader))) == expected, name
            loader.set_epoch(0)
            iterator = iter(loader)
            head = [plain(next(iterator)) for _ in range(len(expected[0]) // 2)]
            state = pickle.loads(pickle.dumps(loader.state_dict()))
        with DataLoader(build(), make(3)) as resumed:
            resumed.load_state_dict(state)
            assert head + plain(list(resumed)) == expected[0], f"{name}: 2 -> 3 workers"
            assert plain(list(resumed)) == expected[1], f"{name}: the next epoch"
