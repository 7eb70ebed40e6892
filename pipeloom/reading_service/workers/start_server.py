"""Start-up under spawn: a start server, a template per pipeline, workers forked from it.

``spawn`` gives each worker a fresh interpreter that inherits nothing from the
user's process (no CUDA context, no held locks, no threads), at a price: every
worker imports torch again, and every worker receives and unpickles the whole
pipeline (a dataset of 128 MiB of strings: ~0.6 s to unpickle, per worker).

Here, with the same guarantee, a worker starts in milliseconds::

    user process ──(socket)──> start server          fresh interpreter, started once
                                    │ fork            per user process (torch and
                                    v                 pipeloom imported there once)
    payload (socket stream) ──> template              one per pipeline: unpickles it once
                                    │ fork × N
                                    v
                                 workers              inherit the pipeline copy-on-write

* The **start server** (:class:`StartServer`, one per user process) is a fresh
  interpreter (``subprocess`` of ``sys.executable``, like ``forkserver``'s); it
  imports pipeloom (and so torch) once and never runs user code. It exits with
  the user's process (it watches it through a pidfd).
* A **template** (:class:`Template`) is forked from the server for each
  payload; the main process pickles the pipeline meanwhile (big lists of
  strings without the memo: ``atoms.py``), streamed over a socket whose other
  end travels with ``SCM_RIGHTS``; the template prepares itself as ``spawn``
  prepares a child (``sys.path``, working directory, environment, the main
  module) and unpickles the pipeline once, as it arrives.
* Each **worker** is forked from the template: it inherits the unpickled
  pipeline, so its start is flat in the dataset's size and the worker count.
  Its arguments (queues, pipes: descriptors with ``SCM_RIGHTS``) are pickled
  per worker as ``spawn`` pickles them. The template reports its pid, then its
  exit status, on a socket that is the worker's sentinel in the user process
  (:class:`ServedProcess`), so a killed worker raises as under ``spawn``.

The processes' side (server, template, worker) is in ``served.py``.

A template ends when its payload is closed (the pool stopped or dropped) and
its workers exited, or when the user's process dies (it kills its workers).
While it unpickles the pipeline (user code, which may block) it does not
watch the user's process yet: the kernel kills it if the start server exits
(``PR_SET_PDEATHSIG``), which the server does when the user's process ends.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import multiprocessing.connection
import multiprocessing.spawn
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from multiprocessing import context as mp_context
from multiprocessing import reduction, util
from typing import Any

from ...errors import WorkerTimeout
from .served import CODE, HEADER, PAYLOAD, InheritedFd, recv_exactly, send

__all__ = [
    "ServedContext",
    "ServedProcess",
    "StartServer",
    "Template",
    "TemplateGone",
    "start_server",
]

_CHUNK = 1 << 20  # bytes of pickle sent at once to a template
_REAP_TIMEOUT = 5.0  # seconds a closed template gets to exit and be reaped by the server


# -- the user's side -------------------------------------------------------------------
class StartServer:
    """The user process's start server: a fresh interpreter that forks templates.

    Started on first use (:func:`start_server`) and kept for every later
    loader of the process; it exits with the user's process.
    """

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        paths = [path or os.getcwd() for path in sys.path]
        code = (
            f"import sys; sys.path[:0] = {paths!r}; "
            "from pipeloom.reading_service.workers.served import serve; "
            f"serve({theirs.fileno()}, {os.getpid()})"
        )
        command = [
            multiprocessing.spawn.get_executable(),
            *util._args_from_interpreter_flags(),  # type: ignore[attr-defined]  # noqa: SLF001
            "-c",
            code,
        ]
        try:
            self._process = subprocess.Popen(  # noqa: S603 - our own interpreter
                command, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL
            )
        finally:
            theirs.close()
        self._socket = ours
        self._lock = threading.Lock()
        self.pid = self._process.pid
        self._finalizer = weakref.finalize(self, _close_server, ours, self._process)

    def new_template(self, write_payload: Callable[[Any], object]) -> Template:
        """A template holding the pipeline that ``write_payload(file)`` pickles, forked
        from the server; it unpickles the stream as it is written (both at once).

        An error from ``write_payload`` ends the template and propagates.
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        reaped, reaper = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        stream, unpickler_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            preparation = multiprocessing.spawn.get_preparation_data("pipeloom-template")
            preparation["authkey"] = bytes(preparation["authkey"])  # prepare() wraps it again
            setup = pickle.dumps((preparation, dict(os.environ), os.getpid()))
            fds = [unpickler_end.fileno(), theirs.fileno(), reaper.fileno()]
            with self._lock:
                try:
                    send(self._socket, setup, fds)
                finally:  # the server has its copies: a template that dies closes the stream
                    theirs.close()
                    reaper.close()
                    unpickler_end.close()
                # pickled while the server forks the template (its pid is read after)
                failure = _write_payload(stream, write_payload)
                (pid,) = HEADER.unpack(recv_exactly(self._socket, HEADER.size))
        except (OSError, EOFError) as error:
            for sock in (ours, reaped, stream):
                sock.close()
            raise RuntimeError(
                f"the pipeloom start server (pid {self.pid}) did not start a template "
                f"({type(error).__name__}: {error}); it may have been killed. Use "
                f"start_method='forkserver' or 'fork' if this persists"
            ) from error
        template = Template(ours, pid, reaped)
        if failure is not None:
            template.close()
            raise failure
        return template

    def alive(self) -> bool:
        return self._process.poll() is None

    def close(self) -> None:
        """Make the server exit and reap it."""
        self._finalizer()


def _close_server(sock: socket.socket, process: subprocess.Popen) -> None:
    sock.close()  # the server exits at EOF
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - a server stuck in import
        process.kill()
        process.wait()


_server: StartServer | None = None
_server_lock = threading.Lock()


def start_server() -> StartServer:
    """This process's start server, started on first use (or again, if it died)."""
    global _server  # noqa: PLW0603 - one server per user process, by design
    with _server_lock:
        if _server is None or not _server.alive():
            if _server is not None:
                _server.close()
            _server = StartServer()
        return _server


def _forget_server_in_child() -> None:
    global _server  # noqa: PLW0603
    if _server is not None:  # the parent's: a forked child starts its own, if it needs one
        _server._finalizer.detach()  # noqa: SLF001 - closing its copy of the socket is enough
    _server = None


os.register_at_fork(after_in_child=_forget_server_in_child)


def _write_payload(
    stream: socket.socket, write_payload: Callable[[Any], object]
) -> BaseException | None:
    """Run ``write_payload`` on ``stream`` and close it; what it raised, if anything."""
    try:
        writer = _Stream(stream)
        write_payload(writer)
        writer.flush()
    except BaseException as error:  # noqa: BLE001 - raised by the caller, once the server answered
        return error
    finally:
        stream.close()
    return None


class TemplateGone(RuntimeError):
    """A template process stopped reading its pipeline or answering (it was killed)."""


class _Stream:
    """A writable file over a socket, for a pickler: sends in chunks of :data:`_CHUNK`."""

    def __init__(self, sock: socket.socket) -> None:
        self._socket = sock
        self._buffer = bytearray()

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        if size >= _CHUNK:  # a big chunk goes as it is, without a copy into the buffer
            self.flush()
            self._send(data)
            return size
        self._buffer += data
        if len(self._buffer) >= _CHUNK:
            self.flush()
        return size

    def flush(self) -> None:
        if not self._buffer:  # the template may have read it all and closed its end
            return
        self._send(self._buffer)
        self._buffer.clear()

    def _send(self, data: Any) -> None:
        try:
            self._socket.sendall(data)
        except OSError as error:
            raise TemplateGone(
                f"the pipeloom template process stopped reading its pipeline "
                f"({type(error).__name__}: {error}); it may have been killed"
            ) from error


class Template:
    """The user side of one template: start workers from it; close it when done.

    The template process exits once this is closed and its workers have exited.
    """

    def __init__(self, sock: socket.socket, pid: int, reaped: socket.socket) -> None:
        self.pid = pid
        self._socket = sock
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _close_template, sock, reaped, pid)
        self._finalizer.atexit = False  # at exit, the template sees the user process end

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def start(self, target: Any, args: tuple, name: str, payload: Any) -> tuple[int, socket.socket]:
        """Fork a worker running ``target(*args)``; (its pid, its status socket)."""
        fds: list[int] = []
        buffer = io.BytesIO()
        popen = _Spawning(fds)
        mp_context.set_spawning_popen(popen)  # type: ignore[arg-type]
        try:
            _WorkerPickler(buffer, payload).dump((target, args, name))
        finally:
            mp_context.set_spawning_popen(None)  # type: ignore[attr-defined]
        status, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        timeout = getattr(payload, "start_timeout", None)
        status.settimeout(timeout)  # the first worker waits for the template's unpickling
        try:
            with self._lock:
                send(self._socket, buffer.getvalue(), [*fds, theirs.fileno()])
            (pid,) = HEADER.unpack(recv_exactly(status, HEADER.size))
            status.settimeout(None)
        except TimeoutError:
            status.close()
            self.kill()  # stuck in the pipeline's unpickling: it would never start a worker
            raise WorkerTimeout(
                f"the pipeloom template process (pid {self.pid}) did not start {name!r} within "
                f"timeout={timeout} s: it was still unpickling the pipeline (a __setstate__ or "
                f"__reduce__ that blocks or is slow?); raise the timeout, or make unpickling "
                f"the dataset cheap (open files in lazy_init instead)"
            ) from None
        except (OSError, EOFError) as error:
            status.close()
            raise RuntimeError(
                f"the pipeloom template process (pid {self.pid}) did not start {name!r} "
                f"({type(error).__name__}: {error}); it may have been killed"
            ) from error
        finally:
            theirs.close()
            for fd in popen.owned:
                os.close(fd)
        return pid, status

    def close(self) -> None:
        self._finalizer()

    def kill(self) -> None:
        """End the template now (SIGKILL), whatever it is doing, then close it."""
        with contextlib.suppress(ProcessLookupError):  # not reaped before close: still its pid
            os.kill(self.pid, signal.SIGKILL)
        self.close()


def _close_template(sock: socket.socket, reaped: socket.socket, pid: int) -> None:
    """Close the template's control socket; wait (briefly) until the server reaped it.

    Its workers (which hold the last references to it) have exited by now, so the
    template exits at once; waiting for the server's notice leaves no zombie behind.
    One that has not exited within :data:`_REAP_TIMEOUT` is killed (the server has
    not reaped it, so the pid is still its own).
    """
    sock.close()
    try:
        if not multiprocessing.connection.wait([reaped], _REAP_TIMEOUT):
            # Still running: stuck before reading its control socket (unpickling the
            # pipeline: a __setstate__ that blocks), or a worker that does not exit.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            multiprocessing.connection.wait([reaped], _REAP_TIMEOUT)
    finally:
        reaped.close()


class _Spawning:
    """Stands for ``multiprocessing``'s spawning Popen while a worker's arguments are pickled:
    descriptors (queues, pipes) are collected to travel with ``SCM_RIGHTS``."""

    def __init__(self, fds: list[int]) -> None:
        self.fds = fds
        self.owned: list[int] = []

    def duplicate_for_child(self, fd: int) -> int:
        fd = os.dup(fd)
        self.owned.append(fd)
        self.fds.append(fd)
        return len(self.fds) - 1

    def DupFd(self, index: int) -> InheritedFd:  # noqa: N802 - multiprocessing's name
        return InheritedFd(index)


class _WorkerPickler(reduction.ForkingPickler):
    def __init__(self, file: io.BytesIO, payload: Any) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self._payload = payload

    def persistent_id(self, obj: Any) -> Any:
        return PAYLOAD if obj is self._payload and obj is not None else None


class ServedProcess:
    """A worker forked by a template, with the part of ``multiprocessing.Process``'s
    interface that :class:`~.process.WorkerProcess` uses."""

    def __init__(self, template: Template, target: Any, args: tuple, name: str, payload: Any):
        self._template = template
        self._start = (target, args, name, payload)
        self.name = name
        self.pid: int | None = None
        self._status: socket.socket | None = None
        self._code: int | None = None

    def start(self) -> None:
        target, args, name, payload = self._start
        self.pid, self._status = self._template.start(target, args, name, payload)
        del self._start

    @property
    def sentinel(self) -> int:
        """Readable once the worker's exit status arrived (or its template died)."""
        if self._status is None:
            raise ValueError("process not started, or closed")
        return self._status.fileno()

    @property
    def exitcode(self) -> int | None:
        if self._code is None and self._status is not None:
            if multiprocessing.connection.wait([self._status], 0):
                self._read_code()
        return self._code

    def _read_code(self) -> None:
        assert self._status is not None
        try:
            self._code = CODE.unpack(recv_exactly(self._status, CODE.size))[0]
        except (OSError, EOFError):  # the template died: its workers were killed
            self._code = -signal.SIGKILL

    def join(self, timeout: float | None = None) -> None:
        if self._code is None and self._status is not None:
            if multiprocessing.connection.wait([self._status], timeout):
                self._read_code()

    def is_alive(self) -> bool:
        return self.exitcode is None

    def kill(self) -> None:
        if self.exitcode is None and self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    terminate = kill

    def close(self) -> None:
        if self._status is not None:
            self._status.close()
            self._status = None


class ServedContext:
    """``multiprocessing``'s spawn context, whose processes start from a template.

    A process is started from the template of the ``Payload`` among its
    arguments (see :class:`~.process.Payload`); one without a payload is
    spawned as usual.
    """

    def __init__(self) -> None:
        self._spawn = multiprocessing.get_context("spawn")

    def get_start_method(self) -> str:
        return "spawn"

    def Pipe(self, duplex: bool = True) -> Any:  # noqa: N802 - multiprocessing's name
        return self._spawn.Pipe(duplex)

    def Process(  # noqa: N802 - multiprocessing's name
        self, target: Any, args: tuple, name: str, daemon: bool = True
    ) -> Any:
        from .process import Payload

        payloads = [arg for arg in args if isinstance(arg, Payload)]
        if not payloads:
            return self._spawn.Process(target=target, args=args, name=name, daemon=daemon)
        return ServedProcess(payloads[0].template(), target, args, name, payloads[0])

    def __repr__(self) -> str:
        return "ServedContext(spawn, through pipeloom's start server)"
