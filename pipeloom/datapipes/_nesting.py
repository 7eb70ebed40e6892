"""Whether the current thread runs inside a pipeline: a nested ``iter()`` restarts nothing.

A block's own ``__iter__`` generator runs through :func:`nested_call`, so an
``iter(self.source)`` inside it does not restart the pipeline; only the
outermost ``iter()`` does, through the graph.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["NESTING", "nested_call"]


class _Nesting(threading.local):
    depth = 0


NESTING = _Nesting()


def nested_call(fn: Callable[[Any], Any], arg: Any) -> Any:
    """Call ``fn(arg)`` marked as running inside a pipeline (inner ``iter()`` won't reset)."""
    nesting = NESTING
    nesting.depth += 1
    try:
        return fn(arg)
    finally:
        nesting.depth -= 1
