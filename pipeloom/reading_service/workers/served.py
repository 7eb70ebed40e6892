"""The start server's side of spawning through it: the server, a template, a worker.

What runs in the processes ``start_server.py`` starts (see its docstring for
the picture), and the framing both sides use: a message is a length, the
descriptors sent with it (``SCM_RIGHTS``), then the bytes.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import io
import multiprocessing
import multiprocessing.connection
import multiprocessing.spawn
import multiprocessing.util
import os
import pickle
import signal
import socket
import struct
import sys
import traceback
from typing import Any

__all__ = [
    "CODE",
    "HEADER",
    "PAYLOAD",
    "InheritedFd",
    "inherited_fds",
    "open_pidfd",
    "recv",
    "recv_exactly",
    "send",
    "serve",
]

HEADER = struct.Struct("!Q")
CODE = struct.Struct("!i")
MAX_FDS = 64
PAYLOAD = "pipeloom-payload"  # the persistent id of the payload in a worker's arguments


# -- framing: a length, descriptors, bytes ------------------------------------------
def send(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    socket.send_fds(sock, [HEADER.pack(len(data))], fds)
    sock.sendall(data)


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One message and its descriptors; ``EOFError`` when the peer closed."""
    header, fds, _, _ = socket.recv_fds(sock, HEADER.size, MAX_FDS)
    if not header:
        raise EOFError
    if len(header) < HEADER.size:
        header += recv_exactly(sock, HEADER.size - len(header))
    (size,) = HEADER.unpack(header)
    return recv_exactly(sock, size), fds


def open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # pragma: no cover - no pidfd (non-Linux, old kernel)
        return None


class InheritedFd:
    """A descriptor a worker received from the template, by its position."""

    def __init__(self, index: int) -> None:
        self.index = index

    def detach(self) -> int:
        return inherited_fds[self.index]


inherited_fds: list[int] = []


_PR_SET_PDEATHSIG = 1  # prctl(2)


# -- the server's side -----------------------------------------------------------------
def serve(fd: int, user_pid: int) -> None:
    """The start server's loop: fork a template per request, until the user process ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the user process's to handle
    sock = socket.socket(fileno=fd)
    user = open_pidfd(user_pid)
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
                setup, fds = recv(sock)
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
            child = open_pidfd(pid)
            if child is not None:
                templates[child] = (pid, notice)
            else:  # pragma: no cover - no pidfd: no notice either
                os.close(notice)
            sock.sendall(HEADER.pack(pid))
    os._exit(0)  # templates watch the user's process themselves


def _template_main(setup: bytes, fds: list[int]) -> None:
    stream_fd, control_fd = fds
    control = socket.socket(fileno=control_fd)
    # Until it watches the user's process (after unpickling, which runs user code that
    # may block), the template dies with the server, which exits with the user's process.
    server = os.getppid()
    _die_with_parent(True)
    if os.getppid() != server:  # the server (so the user's process) ended meanwhile
        return
    preparation, environ, user_pid = pickle.loads(setup)
    os.environ.clear()
    os.environ.update(environ)
    multiprocessing.spawn.prepare(preparation)
    gc.disable()  # unpickling allocates objects that all live: no collection meanwhile
    try:
        with socket.socket(fileno=stream_fd) as stream, stream.makefile("rb") as file:
            try:
                loaded = _Loaded(pickle.load(file), None)
            except Exception as error:  # noqa: BLE001 - each worker raises it, as under spawn
                loaded = _Loaded(None, error)
    finally:
        gc.enable()
    gc.freeze()  # workers' collections skip the pipeline: its pages stay shared with the template
    user = open_pidfd(user_pid)
    _die_with_parent(False)  # it watches the user's process itself from now on
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
                status.sendall(CODE.pack(os.waitstatus_to_exitcode(wait_status)))
            except OSError:
                pass
            status.close()
            os.close(pidfd)
        if open_control and control in ready:
            try:
                data, received = recv(control)
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
            status.sendall(HEADER.pack(pid))


def _die_with_parent(on: bool) -> None:
    """Have the kernel SIGKILL this process when its parent exits (Linux), or stop it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL if on else 0, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux: the user pidfd only
        pass


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
        if pid != PAYLOAD:
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return self._payload


def _worker_main(data: bytes, fds: list[int], loaded: _Loaded) -> None:
    """In a worker forked from the template: unpickle its arguments, run, exit.

    It exits as ``multiprocessing``'s forked children do on this Python: from
    3.13 on, their exit handlers (``multiprocessing.util.Finalize``, the
    worker's ``atexit`` functions) run in ``popen_fork``, no longer in
    ``Process._bootstrap``.
    """
    code = 1
    exit_handlers = sys.version_info >= (3, 13)
    if exit_handlers:
        atexit._clear()  # type: ignore[attr-defined]  # the template's, as popen_fork does
        atexit.register(multiprocessing.util._exit_function)  # type: ignore[attr-defined]
    try:
        inherited_fds[:] = fds
        target, args, name = _WorkerUnpickler(io.BytesIO(data), loaded).load()
        process = multiprocessing.Process(target=target, args=args, name=name, daemon=True)
        code = process._bootstrap()  # type: ignore[attr-defined]  # noqa: SLF001
    except BaseException:  # noqa: BLE001 - report, then exit
        traceback.print_exc()
    finally:
        if exit_handlers:
            atexit._run_exitfuncs()  # type: ignore[attr-defined]
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
