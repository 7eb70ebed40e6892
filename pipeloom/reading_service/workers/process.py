"""Worker processes: how every pool starts, watches and stops them.

One copy of the mechanism, used by the classic pool
(``strategies/classic/process_pool.py``), the economic and chunked pool
(``strategies/dispatch/pool.py``) and a separate process
(``workers/separate_process.py``).

In the main process:

* :func:`worker_context`: the ``multiprocessing`` context; a fork server
  preloads pipeloom, so its workers start without importing torch again.
* :class:`Payload`: the part of the pipeline a worker runs; the object itself
  under ``fork``, its cloudpickle under ``spawn``/``forkserver`` (a block that
  cannot travel is named in the error).
* :class:`WorkerProcess`: one started process; its label, its exit described
  (``exits.py``), its death turned into a ``WorkerError``.
* :func:`stop_processes`: one grace period (:data:`STOP_GRACE`) for all to
  exit, then the rest are killed.

In the worker: :func:`bootstrap` (first thing a worker does),
:meth:`Payload.load`, :func:`parent_watch` (a descriptor that becomes
readable when the main process dies).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import io
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import select
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing import forkserver
from typing import Any

import cloudpickle
import numpy.random  # noqa: F401 - see _PREIMPORTED
import torch

from ..._shutdown import Steps
from ...datapipes import DataPipe
from ...datapipes.runtime import NO_STAMP, forget_lazy_init, restore_stamp
from ...errors import WorkerError
from ...graph import upstream
from ...stats.worker_reports import reporting
from . import atoms
from .exits import describe_exit, exit_advice
from .job_signals import leaving_job_signals
from .start_server import ServedContext, Template, TemplateGone, start_server

__all__ = [
    "EXIT_GRACE",
    "PRELOAD",
    "SERVER_ENV",
    "STOP_GRACE",
    "Payload",
    "WorkerProcess",
    "bootstrap",
    "parent_watch",
    "stop_processes",
    "worker_context",
]

STOP_GRACE = 1.0
"""Seconds workers get to exit after being told to stop, before they are killed."""
EXIT_GRACE = 5.0
"""Seconds an exiting worker (its sentinel fired, its queue broke) gets to be reaped."""
SERVER_ENV = "PIPELOOM_SPAWN_SERVER"
"""Environment variable: ``0`` spawns workers with ``multiprocessing``'s plain spawn."""
PRELOAD = "pipeloom.reading_service"
"""What a fork server imports once for all the workers it forks."""

# Every worker seeds NumPy's global RNG, and NumPy 2 imports ``numpy.random``
# lazily: imported here once, a forked worker inherits it instead of spending
# ~10 ms of CPU importing it at each start (each epoch without persistent_workers).
_PREIMPORTED = (numpy.random,)
_MALLOC_KEEP = 1 << 30  # M_MMAP_THRESHOLD and M_TRIM_THRESHOLD for worker processes


# -- starting ---------------------------------------------------------------------
def worker_context(start_method: str | None) -> Any:
    """``multiprocessing.get_context(start_method)``; spawn through pipeloom's start server.

    Spawned workers are forked from a template of their pipeline, itself forked
    from pipeloom's start server (a fresh interpreter, see ``start_server.py``):
    the same clean process as under spawn, started in milliseconds, with the
    pipeline unpickled once per loader instead of once per worker (Linux:
    pidfds). Set the environment variable ``PIPELOOM_SPAWN_SERVER=0`` for
    ``multiprocessing``'s plain spawn.

    Forkserver workers are forked from one server process. With pipeloom (and
    so torch) imported there once, a worker starts in a fraction of a second
    instead of importing torch itself as under spawn. A server that is already
    running keeps the modules it was started with.

    Example:
        >>> worker_context("spawn").get_start_method()
        'spawn'
        >>> worker_context("fork").get_start_method()
        'fork'
    """
    context = multiprocessing.get_context(start_method)
    served = hasattr(os, "pidfd_open") and os.environ.get(SERVER_ENV, "1") != "0"
    if context.get_start_method() == "spawn" and served:
        return ServedContext()
    if context.get_start_method() == "forkserver":
        server = getattr(forkserver, "_forkserver", None)
        modules = list(getattr(server, "_preload_modules", None) or ["__main__"])
        if PRELOAD not in modules:
            forkserver.set_forkserver_preload([*modules, PRELOAD])
    return context


class Payload:
    """The part of a pipeline a worker runs, ready to cross into it.

    Under ``fork`` the child inherits the object itself; otherwise it is
    pickled here, once, with cloudpickle (so lambdas travel). Under spawn
    through the start server, the pickle goes once to a template process
    (:meth:`template`), which unpickles it once for all the workers it forks;
    :meth:`close` ends the template.

    ``start_timeout`` (the service's ``timeout``) bounds the wait for a
    template to start the first worker, i.e. to unpickle the pipeline.

    Raises:
        TypeError: naming the first block that cannot be pickled, and why.
    """

    def __init__(self, pipe: DataPipe, context: Any, *, start_timeout: float | None = None) -> None:
        self.forked = context.get_start_method() == "fork"
        self.start_timeout = start_timeout
        self._template: Template | None = None
        if isinstance(context, ServedContext):  # the template unpickles while it is pickled
            pickled: list[bytes] = []  # kept, to start its template again if closed
            self._template = start_server().new_template(lambda file: _dumps(pipe, file, pickled))
            self._content: Any = pickled
        else:
            self._content = pipe if self.forked else _dumps(pipe)

    def template(self) -> Template:
        """The template process holding this payload unpickled (started again if closed)."""
        if self._template is None or self._template.closed:
            self._template = start_server().new_template(self._write_content)
        return self._template

    def _write_content(self, file: Any) -> None:
        for chunk in self._content:
            file.write(chunk)

    def close(self) -> None:
        """End the template process, if any (once its workers have exited)."""
        if self._template is not None:
            self._template.close()
            self._template = None

    def __getstate__(self) -> dict[str, Any]:
        content = self._content
        if isinstance(content, list):  # pickled chunks, as sent to a template
            content = b"".join(content)
        return {
            "forked": self.forked,
            "_content": content,
            "_template": None,
            "start_timeout": self.start_timeout,
        }

    def load(self) -> Any:
        """The pipeline, in the worker: unpickled, or (forked) with ``lazy_init`` to run again."""
        if self.forked:
            forget_lazy_init(self._content)
            return self._content
        return pickle.loads(self._content)


class WorkerProcess:
    """One worker process, as the main process sees it.

    Args:
        context: a ``multiprocessing`` context (see :func:`worker_context`).
        name: e.g. ``"worker process 0"``; the label adds the pid.
        target, args: what the process runs.
        block: ``repr`` of the block it runs, for a separate process.
        process_name: the process's name (``ps``); default ``pipeloom-<name>``.

    Once stopped (:func:`stop_processes`) it holds no descriptor: its exit
    code is kept, and ``multiprocessing``'s pipes to the process are closed.
    """

    def __init__(
        self,
        context: Any,
        name: str,
        target: Callable[..., None],
        args: tuple,
        *,
        block: str | None = None,
        process_name: str | None = None,
    ) -> None:
        self.name = name
        self.block = block
        if process_name is None:
            process_name = f"pipeloom-{name.replace(' ', '-')}"
        self.process = context.Process(
            target=reporting(leaving_job_signals(target)),
            args=args,
            name=process_name,
            daemon=True,
        )
        self.process.start()
        self.pid: int = self.process.pid
        self._final_code: int | None = None  # the exit code, once the process was released
        self.reported = False  # its death was described (died()), to be raised

    @property
    def label(self) -> str:
        return f"{self.name} (pid {self.pid})"

    @property
    def sentinel(self) -> int:
        """A descriptor that becomes readable when the process exits (while not released)."""
        return self.process.sentinel

    @property
    def released(self) -> bool:
        """True once the process was reaped and its descriptors closed."""
        return self._final_code is not None

    def exit_code(self) -> int | None:
        """The exit code, None while the process runs.

        The sentinel becomes readable as the exiting process's files close, a
        moment before its exit status is published. Its edge wakes a waiter
        once: reading ``exitcode`` right then could say "running", and the
        waiter would sleep on a sentinel that never fires again. So once the
        sentinel fired, wait (at most :data:`EXIT_GRACE`) for the status.
        """
        if self._final_code is not None:
            return self._final_code
        code = self.process.exitcode
        if code is None and multiprocessing.connection.wait([self.sentinel], 0):
            self.process.join(EXIT_GRACE)
            code = self.process.exitcode
        return code

    def died(self, cause: BaseException | None = None) -> WorkerError:
        """The error for this worker's death (or its queue breaking) before the epoch ended."""
        self.reported = True
        if cause is not None and not self.released:  # its queue broke: let it finish dying
            self.process.join(EXIT_GRACE)
        code = self.exit_code() if self.released else self.process.exitcode
        how = "closed its queue" if code is None else describe_exit(code)
        error = WorkerError(
            f"{self.label} {how} before finishing its epoch{exit_advice(code, self.pid)}",
            worker=self.label,
            block=self.block,
            dead_pid=self.pid,
            exit_code=code,
        )
        error.__cause__ = cause
        return error

    def release(self) -> None:
        """Close ``multiprocessing``'s descriptors for an exited, reaped process."""
        if self._final_code is None and self.process.exitcode is not None:
            self._final_code = self.process.exitcode
            self.process.close()


class ExitWatch:
    """Has any worker of a pool exited? One poll over all their sentinels.

    A worker's sentinel is readable once it exited, so an empty poll rules out
    every death with one system call, where asking each worker costs a poll
    and a ``waitpid``. Workers appended to the list later are watched too.

    Example:
        >>> ExitWatch([]).any_exited()
        False
    """

    def __init__(self, workers: list[WorkerProcess]) -> None:
        self.workers = workers
        self._poll = select.poll()
        self._registered = 0

    def any_exited(self, wait: float = 0.0) -> bool:
        """Whether a sentinel fired (or a worker was reaped), waiting at most ``wait`` s."""
        while self._registered < len(self.workers):  # pools start workers one by one
            worker = self.workers[self._registered]
            if worker.released:  # reaped: its descriptor is closed
                return True
            self._poll.register(worker.sentinel, select.POLLIN)
            self._registered += 1
        return bool(self._poll.poll(math.ceil(max(wait, 0.0) * 1000)))


def stop_processes(workers: Sequence[WorkerProcess], grace: float = STOP_GRACE) -> None:
    """Wait one shared ``grace`` period for ``workers`` to exit, then kill the rest.

    A worker stuck in user code cannot hear "stop"; killing it is the only way out.
    Each exited worker is then released (:meth:`WorkerProcess.release`), so a
    stopped pool holds no descriptor. Safe to call again.
    """
    workers = [worker for worker in workers if not worker.released]
    deadline = time.monotonic() + grace
    with Steps() as steps:  # an error joining one worker leaves none of them running
        for worker in workers:
            steps.run(worker.process.join, max(0.0, deadline - time.monotonic()))
        for worker in workers:
            steps.run(_kill_and_release, worker)


def _kill_and_release(worker: WorkerProcess) -> None:
    if worker.process.exitcode is None:
        worker.process.kill()
        worker.process.join(timeout=EXIT_GRACE)
    worker.release()


# -- in the worker ----------------------------------------------------------------
def bootstrap(name: str, *, reuse_freed_memory: bool = False) -> str:
    """What a worker process does first; returns its label (``"<name> (pid N)"``).

    Ctrl-C is left to the main process (so are the job signals it handles,
    see ``job_signals``); nothing of the parent's item stamp survives the
    fork; torch gets one intra-op thread per worker, as in torch's loader (a
    forked child must not use the OpenMP pool it inherited from a parent that
    ran parallel torch ops). ``reuse_freed_memory``: see :func:`keep_freed_memory_for_reuse`.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    restore_stamp(NO_STAMP)
    torch.set_num_threads(1)
    if reuse_freed_memory:
        keep_freed_memory_for_reuse()
    return f"{name} (pid {os.getpid()})"


def parent_watch() -> list[int]:
    """A pidfd that becomes readable when the parent process exits (Linux), else [].

    Under fork, sibling workers inherit the write ends of each other's pipes,
    so the parent's death does not close them: a worker that waits on a pipe
    from the parent must watch the parent itself too.
    """
    try:
        return [os.pidfd_open(os.getppid())]
    except (AttributeError, OSError):
        return []


def keep_freed_memory_for_reuse() -> bool:
    """Make glibc's malloc reuse freed large blocks in this (worker) process.

    By default glibc gives every block over 32 MiB its own ``mmap`` and
    returns it on ``free``, so a worker that collates a 128 MiB batch touches
    128 MiB of fresh pages each time (a page fault per 4 KiB: ~130 ms on the
    reference VM, more than the work). Raising the thresholds keeps such blocks
    in the heap for the next batch: 2-4x the throughput on 128 MiB batches, for
    about one batch of items and one collated batch of private memory kept per
    worker between batches. Returns False where there is no glibc.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, _MALLOC_KEEP)) and bool(
        mallopt(m_trim_threshold, _MALLOC_KEEP)
    )


# -- pickling a pipeline ------------------------------------------------------------
def _dumps(pipe: DataPipe, file: Any = None, copy: list[bytes] | None = None) -> bytes:
    """cloudpickle's bytes of ``pipe`` (:mod:`.atoms`: big lists of strings pickled fast);
    or written into ``file`` and appended to ``copy`` as they come."""
    try:
        if file is None:
            return atoms.dumps(pipe)
        atoms.dump(pipe, _Tee(file, [] if copy is None else copy))
        return b""
    except TemplateGone:
        raise  # the template process stopped reading: not the pipeline's fault
    except Exception as error:  # noqa: BLE001 - find the culprit, then explain
        culprit, reason = _find_unpicklable(pipe, error)
        raise TypeError(
            f"the pipeline cannot be sent to worker processes started with spawn/forkserver: "
            f"{culprit} cannot be pickled ({reason}). Define its functions and classes at "
            f"module level, drop unpicklable attributes in __getstate__ (open them in "
            f"lazy_init instead), or use start_method='fork' or ThreadReadingService "
            f"(pipeloom.compat.DataLoader: multiprocessing_context='fork' or "
            f"worker_type='thread')"
        ) from error


class _Tee:
    """Writes to a file and keeps a copy: the chunks written (bytes are kept, not copied)."""

    def __init__(self, file: Any, copy: list[bytes]) -> None:
        self._file, self._copy = file, copy

    def write(self, data: Any) -> int:
        self._copy.append(data if type(data) is bytes else bytes(data))
        return self._file.write(data)


class _OneBlockPickler(cloudpickle.Pickler):
    """Pickles one block, standing in a placeholder for every other block."""

    def __init__(self, file: io.RawIOBase | io.BytesIO, block: DataPipe) -> None:
        super().__init__(file)
        self._block = block

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, DataPipe) and obj is not self._block:
            return id(obj)
        return None


def _find_unpicklable(pipe: DataPipe, error: Exception) -> tuple[str, str]:
    for block in reversed(upstream(pipe)):
        try:
            _OneBlockPickler(_Discard(), block).dump(block)
        except Exception as block_error:  # noqa: BLE001
            culprit = f"block {block!r}"
            path, part = _unpicklable_part(block)
            if path:  # e.g. a dataset's open file: its attribute, not just the block
                culprit += f" (its {path.lstrip('.')}, a {type(part).__name__})"
            return culprit, f"{type(block_error).__name__}: {block_error}"
    return "the pipeline", f"{type(error).__name__}: {error}"


def _unpicklable_part(block: DataPipe, depth: int = 6) -> tuple[str, Any]:
    """The attribute path inside ``block`` down to a value that cannot be pickled.

    Follows, level by level, the first attribute (or item) that fails to
    pickle on its own: ``.fetch.dataset.lock`` names a user's dataset's lock
    held by a block that wraps it. ``("", block)`` when no part fails alone.
    """
    path, current = "", block
    for _ in range(depth):
        for name, value in _parts(current):
            try:
                _OneBlockPickler(_Discard(), block).dump(value)
            except Exception:  # noqa: BLE001 - this one fails: look inside it
                path, current = path + name, value
                break
        else:
            break
    return path, current


def _parts(value: Any) -> list[tuple[str, Any]]:
    """What pickling ``value`` pickles in turn: its state's attributes, or its items."""
    if isinstance(value, dict):
        return [(f"[{key!r}]", item) for key, item in value.items()]
    if isinstance(value, (list, tuple)):
        return [(f"[{index}]", item) for index, item in enumerate(value)]
    try:
        state = value.__getstate__() if hasattr(value, "__dict__") else None
    except Exception:  # noqa: BLE001 - a __getstate__ that fails: nothing to look into
        return []
    if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
        state = {**(state[0] or {}), **(state[1] or {})}
    if not isinstance(state, dict):
        return []
    return [(f".{name}", item) for name, item in state.items()]


class _Discard(io.RawIOBase):
    """A file that drops what is written (trial pickling, without keeping the bytes)."""

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return memoryview(data).nbytes
