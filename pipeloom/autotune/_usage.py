"""What this process tree uses, read from ``/proc`` (Linux): CPU seconds, resident memory."""

from __future__ import annotations

import os
import resource
import time

__all__ = ["resident_bytes", "tree_cpu_seconds", "workers_cpu_seconds"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def tree_cpu_seconds() -> float:
    """CPU seconds used by this process and its living descendants (worker processes).

    Without ``/proc`` only this process's own time counts.

    Example:
        >>> tree_cpu_seconds() > 0
        True
    """
    total = time.process_time()
    pending = _children(os.getpid())
    while pending:
        pid = pending.pop()
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
        pending.extend(_children(pid))
    return total


def workers_cpu_seconds() -> float:
    """:func:`tree_cpu_seconds` less the calling thread's (the consumer's) own CPU time.

    Example:
        >>> workers_cpu_seconds() >= 0
        True
    """
    return max(tree_cpu_seconds() - time.thread_time(), 0.0)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as children:
                found.extend(int(c) for c in children.read().split())
    except (OSError, ValueError):
        pass
    return found


def resident_bytes() -> int:
    """This process's resident memory now (its peak where ``/proc`` is missing).

    Example:
        >>> resident_bytes() > 0
        True
    """
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
