"""The multiprocessing context that worker processes are started from."""

from __future__ import annotations

import multiprocessing
from multiprocessing import forkserver
from typing import Any

__all__ = ["worker_context"]

PRELOAD = "pipeloom.reading_service"


def worker_context(start_method: str | None) -> Any:
    """``multiprocessing.get_context(start_method)``; a fork server preloads pipeloom.

    Forkserver workers are forked from one server process. With pipeloom (and
    so torch) imported there once, a worker starts in a fraction of a second
    instead of importing torch itself as under spawn. A server that is already
    running keeps the modules it was started with.

    Example:
        >>> worker_context("spawn").get_start_method()
        'spawn'
    """
    context = multiprocessing.get_context(start_method)
    if context.get_start_method() == "forkserver":
        server = getattr(forkserver, "_forkserver", None)
        modules = list(getattr(server, "_preload_modules", None) or ["__main__"])
        if PRELOAD not in modules:
            forkserver.set_forkserver_preload([*modules, PRELOAD])
    return context
