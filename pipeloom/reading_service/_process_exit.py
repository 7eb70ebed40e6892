"""How worker processes end: their exit described, and a bounded stop."""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from typing import Any

from ..queues._peer import is_readable

__all__ = ["STOP_GRACE", "describe_exit", "exit_code", "join_or_kill"]

STOP_GRACE = 1.0  # seconds workers get to exit after "stop" before they are killed
EXIT_GRACE = 5.0  # seconds an exiting process (its sentinel fired) gets to be reaped


def exit_code(process: Any) -> int | None:
    """``process.exitcode``, waiting for it once the process's sentinel has fired.

    The sentinel becomes readable as the exiting process's files close, a
    moment before its exit status is published. Its edge wakes a waiter once:
    reading ``exitcode`` right then could say "running", and the waiter would
    sleep on a sentinel that never fires again.
    """
    code = process.exitcode
    if code is None and is_readable(process.sentinel):
        process.join(EXIT_GRACE)
        code = process.exitcode
    return code


def describe_exit(code: int) -> str:
    """``"was killed by signal SIGKILL"`` or ``"exited with code 1"``.

    Example:
        >>> describe_exit(-9), describe_exit(3)
        ('was killed by signal SIGKILL', 'exited with code 3')
    """
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def join_or_kill(processes: Sequence[Any], grace: float = STOP_GRACE) -> None:
    """Wait one shared ``grace`` period for ``processes`` to exit, then kill the rest.

    A worker stuck in user code cannot hear "stop"; killing it is the only way out.
    """
    deadline = time.monotonic() + grace
    for process in processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.exitcode is None:
            process.kill()
            process.join(timeout=5)
