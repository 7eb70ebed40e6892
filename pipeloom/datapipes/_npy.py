"""``.npy`` headers parsed one thread at a time.

NumPy parses an ``.npy`` header with ``ast.literal_eval``, and CPython 3.11's
``ast`` can fail with "SystemError: AST constructor recursion depth mismatch"
when two threads parse at once (worker threads decoding or snapshotting).
Every header parse in pipeloom goes through :data:`HEADER_LOCK`.
"""

from __future__ import annotations

import ast
import threading
from typing import Any

import numpy as np

__all__ = ["HEADER_LOCK", "literal", "load"]

HEADER_LOCK = threading.Lock()


def literal(text: str) -> Any:
    """``ast.literal_eval(text)``, one thread at a time."""
    with HEADER_LOCK:
        return ast.literal_eval(text)


def load(file: Any, **kwargs: Any) -> Any:
    """``np.load(file, **kwargs)``, one thread at a time (small arrays and memory maps)."""
    with HEADER_LOCK:
        return np.load(file, **kwargs)
