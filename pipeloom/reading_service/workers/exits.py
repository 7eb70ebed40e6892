"""What a worker process's exit says, and what to check for it.

:func:`describe_exit` words the exit (``was killed by signal 9 (SIGKILL)``,
``exited with code 3``); :func:`exit_advice` adds the likely cause and what
to do about it, for the signals that have one and for an exit code.
``WorkerProcess.died`` (``process.py``) puts both in the ``WorkerError``.
"""

from __future__ import annotations

import signal

from ..._exit_status import signal_text

__all__ = ["describe_exit", "exit_advice"]


def exit_advice(code: int | None, pid: int | None = None) -> str:
    """What to check for worker ``pid`` that ended with ``code`` ('' when there is no advice).

    A worker reports an error of the code it runs before it exits, and the
    main process raises that error instead; one that exits with a code of its
    own (not 0, not a signal) without reporting one was ended by that code or
    could not start.

    Example:
        >>> "journalctl -k" in exit_advice(-9, 42), "/dev/shm" in exit_advice(-7), exit_advice(0)
        (True, True, '')
        >>> "os._exit()" in exit_advice(3)
        True
    """
    if code is None or code == 0:
        return ""
    if code > 0:
        return (
            "; it reported no error: code it ran ended the process (os._exit(), or exit() "
            "in a C library), or the process could not start (its traceback, if any, is "
            "on stderr)"
        )
    if code == -signal.SIGKILL:
        killed = "Killed process <pid>" if pid is None else f"Killed process {pid}"
        return (
            f"; it was killed from outside, most often by the out-of-memory killer: the kernel "
            f"log confirms it (`dmesg` or `journalctl -k` shows '{killed}'; for a container, "
            f"look on the host, where the pid differs); if so, lower the batch size, "
            f"num_workers or prefetch_factor"
        )
    return _CRASH_ADVICE.get(-code, "")


_FAULTHANDLER = (
    "run it with `python -X faulthandler` (or num_workers=0, in the main process) to see where"
)

#: What a worker that crashed on these signals most likely met.
_CRASH_ADVICE: dict[int, str] = {
    signal.SIGSEGV: (
        "; it crashed (a segmentation fault, most often in a C extension: an image or "
        f"audio decoder, a native library a block calls): {_FAULTHANDLER}"
    ),
    signal.SIGBUS: (
        "; it crashed on a bus error, most often because shared memory (/dev/shm) was "
        "full when it put a tensor there: free or enlarge /dev/shm (docker run "
        "--shm-size=...) or lower prefetch_factor, num_workers or the batch size; else a "
        f"C extension crashed, or a memory-mapped file shrank while read: {_FAULTHANDLER}"
    ),
    signal.SIGABRT: (
        "; it aborted (a C library or extension called abort(), e.g. on a failed "
        f"assertion): {_FAULTHANDLER}"
    ),
}


def describe_exit(code: int) -> str:
    """``"was killed by signal 9 (SIGKILL)"`` or ``"exited with code 1"``.

    Example:
        >>> describe_exit(-9), describe_exit(3)
        ('was killed by signal 9 (SIGKILL)', 'exited with code 3')
    """
    if code < 0:
        return f"was killed by {signal_text(-code)}"
    return f"exited with code {code}"
