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
    """Resident bytes of shared memory (``/dev/shm``, memfd) this process tree maps (Linux).

    Each segment counts once (its largest resident size in any process); 0 without ``/proc``.

    Example:
        >>> shared_memory_in_use() >= 0
        True
    """
    pids: list[int] = [os.getpid()]
    resident: dict[str, int] = {}
    while pids:
        pid = pids.pop()
        try:
            segment = None
            with open(f"/proc/{pid}/smaps") as smaps:
                for line in smaps:
                    if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                        fields = line.split()
                        shared = len(fields) > 5 and (
                            fields[5].startswith("/dev/shm/") or fields[5].startswith("/memfd:")
                        )
                        segment = fields[4] if shared else None
                    elif segment is not None and line.startswith("Rss:"):
                        size = int(line.split()[1]) * 1024
                        resident[segment] = max(resident.get(segment, 0), size)
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as children:
                    pids.extend(int(c) for c in children.read().split())
        except (OSError, ValueError):
            continue  # a process that just exited, or no /proc
    return sum(resident.values())
