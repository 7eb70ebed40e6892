"""How every message names a signal that ended a process: ``signal 9 (SIGKILL)``.

Both the number (what users search for: "killed by signal 9") and the name
(what the documentation of the cause uses). One wording for the worker pools,
a process of its own and the queues' dead peers.
"""

from __future__ import annotations

import signal

__all__ = ["signal_text"]


def signal_text(number: int) -> str:
    """``"signal 9 (SIGKILL)"``; just the number for one Python has no name for.

    Example:
        >>> signal_text(9), signal_text(7), signal_text(200)
        ('signal 9 (SIGKILL)', 'signal 7 (SIGBUS)', 'signal 200')
    """
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"
