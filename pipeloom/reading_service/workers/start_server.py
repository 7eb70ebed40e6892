"""Start-up under spawn: a start server, a template per pipeline, workers forked from it.

``spawn`` gives each worker a fresh interpreter that inherits nothing from the
user's process (no CUDA context, no held locks, no threads), at a price: every
worker imports torch again, and every worker receives and unpickles the whole
pipeline (a dataset of 128 MiB of strings: ~0.6 s to unpickle, per worker).

Here, with the same guarantee, a worker starts in milliseconds::

    user process ──(socket)──> start server          fresh interpreter, started once
                                    │ fork            per user process (torch and
                                    v                 pipeloom imported there once)
    payload (memfd) ──────────> template              one per pipeline: unpickles it once
                                    │ fork × N
                                    v
                                 workers              inherit the pipeline copy-on-write

* The **start server** (:class:`StartServer`, one per user process) is a fresh
  interpreter (``subprocess`` of ``sys.executable``, like ``forkserver``'s); it
  imports pipeloom (and so torch) once and never runs user code. It exits with
  the user's process (it watches it through a pidfd).
* A **template** (:class:`Template`) is forked from the server for each
  payload: the pipeline is written once into an anonymous shared-memory
  segment (memfd), whose descriptor travels with ``SCM_RIGHTS``; the template
  prepares itself as ``spawn`` prepares a child (``sys.path``, working
  directory, environment, the main module) and unpickles the pipeline once.
* Each **worker** is forked from the template: it inherits the unpickled
  pipeline, so its start is flat in the dataset's size and the worker count.
  Its arguments (queues, pipes: descriptors with ``SCM_RIGHTS``) are pickled
  per worker as ``spawn`` pickles them. The template reports its pid, then its
  exit status, on a socket that is the worker's sentinel in the user process
  (:class:`ServedProcess`), so a killed worker raises as under ``spawn``.

A template ends when its payload is closed (the pool stopped or dropped) and
its workers exited, or when the user's process dies (it kills its workers).
"""

from __future__ import annotations

import io
import multiprocessing
import multiprocessing.connection
import multiprocessing.spawn
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from multiprocessing import context as mp_context
from multiprocessing import reduction, util
from typing import Any

__all__ = [
    "ServedContext",
    "ServedProcess",
    "StartServer",
    "Template",
    "TemplateGone",
    "start_server",
]

_HEADER = struct.Struct("!Q")
_CODE = struct.Struct("!i")
_START_TIMEOUT = 60.0  # seconds for the server to import pipeloom, for a template to answer
_MAX_FDS = 64
_CHUNK = 1 << 20  # bytes of pickle sent at once to a template
_REAP_TIMEOUT = 5.0  # seconds a closed template gets to exit and be reaped by the server
_PAYLOAD = "pipeloom-payload"  # the persistent id of the payload in a worker's arguments


# -- framing: a length, descriptors, bytes ------------------------------------------
def _send(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    socket.send_fds(sock, [_HEADER.pack(len(data))], fds)
    sock.sendall(data)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One message and its descriptors; ``EOFError`` when the peer closed."""
    header, fds, _, _ = socket.recv_fds(sock, _HEADER.size, _MAX_FDS)
    if not header:
        raise EOFError
    if len(header) < _HEADER.size:
        header += _recv_exactly(sock, _HEADER.size - len(header))
    (size,) = _HEADER.unpack(header)
    return _recv_exactly(sock, size), fds


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # pragma: no cover - no pidfd (non-Linux, old kernel)
        return None


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
            "from pipeloom.reading_service.workers.start_server import serve; "
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
                _send(self._socket, setup, fds)
                (pid,) = _HEADER.unpack(_recv_exactly(self._socket, _HEADER.size))
        except (OSError, EOFError) as error:
            for sock in (ours, reaped, stream):
                sock.close()
            raise RuntimeError(
                f"the pipeloom start server (pid {self.pid}) did not start a template "
                f"({type(error).__name__}: {error}); it may have been killed. Use "
                f"start_method='forkserver' or 'fork' if this persists"
            ) from error
        finally:
            theirs.close()
            reaper.close()
            unpickler_end.close()
        template = Template(ours, pid, reaped)
        try:
            writer = _Stream(stream)
            write_payload(writer)
            writer.flush()
        except BaseException:
            stream.close()
            template.close()
            raise
        stream.close()
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


class TemplateGone(RuntimeError):
    """A template process stopped reading its pipeline or answering (it was killed)."""


class _Stream:
    """A writable file over a socket, for a pickler: sends in chunks of :data:`_CHUNK`."""

    def __init__(self, sock: socket.socket) -> None:
        self._socket = sock
        self._buffer = bytearray()

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        self._buffer += data
        if len(self._buffer) >= _CHUNK:
            self.flush()
        return size

    def flush(self) -> None:
        if not self._buffer:  # the template may have read it all and closed its end
            return
        try:
            self._socket.sendall(self._buffer)
        except OSError as error:
            raise TemplateGone(
                f"the pipeloom template process stopped reading its pipeline "
                f"({type(error).__name__}: {error}); it may have been killed"
            ) from error
        self._buffer.clear()


class Template:
    """The user side of one template: start workers from it; close it when done.

    The template process exits once this is closed and its workers have exited.
    """

    def __init__(self, sock: socket.socket, pid: int, reaped: socket.socket) -> None:
        self.pid = pid
        self._socket = sock
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _close_template, sock, reaped)

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
        try:
            with self._lock:
                _send(self._socket, buffer.getvalue(), [*fds, theirs.fileno()])
            (pid,) = _HEADER.unpack(_recv_exactly(status, _HEADER.size))
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


def _close_template(sock: socket.socket, reaped: socket.socket) -> None:
    """Close the template's control socket; wait (briefly) until the server reaped it.

    Its workers (which hold the last references to it) have exited by now, so the
    template exits at once; waiting for the server's notice leaves no zombie behind.
    """
    sock.close()
    try:
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

    def DupFd(self, index: int) -> _InheritedFd:  # noqa: N802 - multiprocessing's name
        return _InheritedFd(index)


class _InheritedFd:
    """A descriptor a worker received from the template, by its position."""

    def __init__(self, index: int) -> None:
        self.index = index

    def detach(self) -> int:
        return _inherited_fds[self.index]


_inherited_fds: list[int] = []


class _WorkerPickler(reduction.ForkingPickler):
    def __init__(self, file: io.BytesIO, payload: Any) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self._payload = payload

    def persistent_id(self, obj: Any) -> Any:
        return _PAYLOAD if obj is self._payload and obj is not None else None


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
            self._code = _CODE.unpack(_recv_exactly(self._status, _CODE.size))[0]
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


# -- the server's side -----------------------------------------------------------------
def serve(fd: int, user_pid: int) -> None:
    """The start server's loop: fork a template per request, until the user process ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the user process's to handle
    sock = socket.socket(fileno=fd)
    user = _pidfd(user_pid)
    if os.getppid() != user_pid:
        return  # the user's process is already gone
    templates: dict[int, tuple[int, int]] = {}  # pidfd -> (pid, "reaped" notice fd)
    watch: list[Any] = [sock] + ([user] if user is not None else [])
    while True:
        ready = multiprocessing.connection.wait([*watch, *templates])
        if user is not None and user in ready:
            break
        for pidfd in [fd for fd in templates if fd in ready]:
            pid, notice = templates.pop(pidfd)
            os.waitpid(pid, 0)
            os.close(notice)  # the user process sees EOF: reaped
            os.close(pidfd)
        if sock in ready:
            try:
                setup, fds = _recv(sock)
            except (EOFError, OSError):
                break
            pid = os.fork()
            if pid == 0:  # the template
                code = 1
                try:
                    sock.close()
                    for pidfd, (_, notice) in templates.items():
                        os.close(pidfd)
                        os.close(notice)
                    os.close(fds.pop())
                    if user is not None:
                        os.close(user)
                    _template_main(setup, fds)
                    code = 0
                except BaseException:  # noqa: BLE001 - report, then leave
                    traceback.print_exc()
                finally:
                    os._exit(code)
            notice = fds.pop()
            for received in fds:
                os.close(received)
            child = _pidfd(pid)
            if child is not None:
                templates[child] = (pid, notice)
            else:  # pragma: no cover - no pidfd: no notice either
                os.close(notice)
            sock.sendall(_HEADER.pack(pid))
    os._exit(0)  # templates watch the user's process themselves


def _template_main(setup: bytes, fds: list[int]) -> None:
    stream_fd, control_fd = fds
    control = socket.socket(fileno=control_fd)
    preparation, environ, user_pid = pickle.loads(setup)
    os.environ.clear()
    os.environ.update(environ)
    multiprocessing.spawn.prepare(preparation)
    with socket.socket(fileno=stream_fd) as stream, stream.makefile("rb") as file:
        try:
            loaded = _Loaded(pickle.load(file), None)
        except Exception as error:  # noqa: BLE001 - each worker raises it, as under spawn
            loaded = _Loaded(None, error)
    user = _pidfd(user_pid)
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, status socket)
    open_control = True
    while open_control or children:
        watch: list[Any] = [*children] + ([user] if user is not None else [])
        if open_control:
            watch.append(control)
        ready = multiprocessing.connection.wait(watch)
        if user is not None and user in ready:
            for pid, _ in children.values():
                _kill(pid)
            for pid, _ in children.values():
                os.waitpid(pid, 0)
            return
        for pidfd in [fd for fd in children if fd in ready]:
            pid, status = children.pop(pidfd)
            _, wait_status = os.waitpid(pid, 0)
            try:
                status.sendall(_CODE.pack(os.waitstatus_to_exitcode(wait_status)))
            except OSError:
                pass
            status.close()
            os.close(pidfd)
        if open_control and control in ready:
            try:
                data, received = _recv(control)
            except (EOFError, OSError):
                open_control = False
                control.close()
                continue
            status = socket.socket(fileno=received[-1])
            pid = os.fork()
            if pid == 0:  # the worker
                control.close()
                for child_pidfd, (_, other) in children.items():
                    os.close(child_pidfd)
                    other.close()
                if user is not None:
                    os.close(user)
                status.close()
                _worker_main(data, received[:-1], loaded)
            for fd in received[:-1]:
                os.close(fd)
            children[os.pidfd_open(pid)] = (pid, status)
            status.sendall(_HEADER.pack(pid))


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class _Loaded:
    """The template's payload: the unpickled pipeline, or why it could not be unpickled."""

    def __init__(self, content: Any, error: BaseException | None) -> None:
        self.content = content
        self.error = error
        self.forked = True

    def load(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.content


class _WorkerUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, payload: _Loaded) -> None:
        super().__init__(file)
        self._payload = payload

    def persistent_load(self, pid: Any) -> Any:
        if pid != _PAYLOAD:
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return self._payload


def _worker_main(data: bytes, fds: list[int], loaded: _Loaded) -> None:
    """In a worker forked from the template: unpickle its arguments, run, exit."""
    code = 1
    try:
        _inherited_fds[:] = fds
        target, args, name = _WorkerUnpickler(io.BytesIO(data), loaded).load()
        process = multiprocessing.Process(target=target, args=args, name=name, daemon=True)
        code = process._bootstrap()  # type: ignore[attr-defined]  # noqa: SLF001
    except BaseException:  # noqa: BLE001 - report, then exit
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
