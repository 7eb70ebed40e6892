"""What a loader's processes use: CPU time, peak resident memory, shared memory (Linux)."""

from __future__ import annotations

import os
import resource
import time

__all__ = ["own_usage", "shared_memory_in_use"]


def own_usage() -> tuple[float, float]:
    """``(CPU seconds, peak resident MiB)`` of the calling process."""
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return time.process_time(), peak_kib / 1024


def shared_memory_in_use() -> int:
    """Bytes of shared memory (``/dev/shm`` files, memfds) this process tree holds open (Linux).

    Counted from the open file descriptors: each segment once, by the blocks
    allocated to it (memory of a segment is allocated as it is touched). 0
    without ``/proc``.

    Example:
        >>> shared_memory_in_use() >= 0
        True
    """
    pids: list[int] = [os.getpid()]
    allocated: dict[tuple[int, int], int] = {}
    while pids:
        pid = pids.pop()
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                path = f"/proc/{pid}/fd/{fd}"
                try:
                    target = os.readlink(path)
                    if target.startswith(("/memfd:", "/dev/shm/")):
                        info = os.stat(path)
                        allocated[(info.st_dev, info.st_ino)] = info.st_blocks * 512
                except OSError:
                    continue  # closed meanwhile
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as children:
                    pids.extend(int(c) for c in children.read().split())
        except (OSError, ValueError):
            continue  # a process that just exited, or no /proc
    return sum(allocated.values())
