"""A local HTTP server that misbehaves on purpose, for the HttpReader tests.

It listens on 127.0.0.1 only. Each path is served by a :class:`Route` that
says how to misbehave on the n-th request for it: answer an error status
first, cut the body short, stall, trickle, ignore ``Range``, change the
file between requests, or break the chunked encoding. Every handler ends by
itself: the body is finite, a stall or a trickle waits on the server's
``release`` event (set when the server stops) with a bound, and a client
that hangs up ends the handler.

Example:
    >>> with HostileServer() as server:
    ...     server.routes["/a.bin"] = Route(b"hello")
    ...     import urllib.request
    ...     urllib.request.urlopen(server.url("/a.bin"), timeout=5).read()
    b'hello'
"""

from __future__ import annotations

import dataclasses
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STALL_LIMIT = 20.0  # seconds a stalled response waits at most, if nobody releases it


@dataclasses.dataclass
class Route:
    """How one path is served.

    Attributes:
        body: the file; ``versions`` replaces it per request when set.
        statuses: error statuses answered to the first requests, in order.
        retry_after: the ``Retry-After`` value sent with 429/503.
        cut: per request, the fraction of the (requested part of the) body
            sent before the connection is closed; None sends it whole.
            The last entry repeats.
        stall: per request, a fraction after which the server stops sending
            (until released); the last entry repeats.
        trickle: seconds between single bytes; None sends at once.
        ranges: answer ``Range`` requests with 206 and advertise it.
        validators: send ``ETag`` and ``Last-Modified``.
        versions: a body per request (the file changes on the server).
        chunked: send the body with chunked transfer encoding.
        garbage_chunk: break the chunked encoding after half the body.
    """

    body: bytes = b""
    statuses: list[int] = dataclasses.field(default_factory=list)
    retry_after: str | None = "0"
    cut: list[float | None] = dataclasses.field(default_factory=lambda: [None])
    stall: list[float | None] = dataclasses.field(default_factory=lambda: [None])
    trickle: float | None = None
    ranges: bool = True
    validators: bool = True
    versions: list[bytes] | None = None
    chunked: bool = False
    garbage_chunk: bool = False


@dataclasses.dataclass(frozen=True)
class Hit:
    path: str
    range: str | None
    if_range: str | None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HostileServer

    def do_GET(self) -> None:  # noqa: N802
        server = self.server
        with server.lock:
            index = sum(hit.path == self.path for hit in server.hits)
            server.hits.append(
                Hit(self.path, self.headers.get("Range"), self.headers.get("If-Range"))
            )
            server.hit.set()
        route = server.routes.get(self.path)
        if route is None:
            self._status(404)
            return
        if index < len(route.statuses):
            self._status(route.statuses[index], route.retry_after)
            return
        served = index - len(route.statuses)
        body = (
            route.versions[min(served, len(route.versions) - 1)] if route.versions else route.body
        )
        tag = f'"v{min(served, len(route.versions) - 1)}"' if route.versions else '"v0"'
        start = self._range_start(route, tag)
        part = body[start:]
        self.send_response(206 if start is not None and route.ranges else 200)
        if start is not None and route.ranges:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            part = body
        if route.ranges:
            self.send_header("Accept-Ranges", "bytes")
        if route.validators:
            self.send_header("ETag", tag)
            self.send_header("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT")
        self.send_header("Connection", "close")
        if route.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        cut = _nth(route.cut, served)
        stall = _nth(route.stall, served)
        stop = len(part) if cut is None else int(len(part) * cut)
        pause = len(part) + 1 if stall is None else int(len(part) * stall)
        try:
            self._send(route, part[:stop], pause, complete=stop == len(part))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up
        self.close_connection = True

    def _range_start(self, route: Route, tag: str) -> int | None:
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if match is None or not route.ranges:
            return None
        if_range = self.headers.get("If-Range")
        if if_range is not None and if_range not in (tag, "Mon, 01 Jan 2024 00:00:00 GMT"):
            return None  # a new version: the whole file
        return int(match.group(1))

    def _send(self, route: Route, data: bytes, pause: int, complete: bool) -> None:
        release = self.server.release
        if route.chunked:
            half = len(data) // 2
            if half:
                self.wfile.write(b"%x\r\n%s\r\n" % (half, data[:half]))
            if route.garbage_chunk:
                self.wfile.write(b"zz-not-a-size\r\n" + data[half:])
                return
            if data[half:]:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data) - half, data[half:]))
            if complete:
                self.wfile.write(b"0\r\n\r\n")
            return
        if route.trickle is not None:
            for i in range(len(data)):
                if release.wait(route.trickle):
                    return
                self.wfile.write(data[i : i + 1])
                self.wfile.flush()
            return
        self.wfile.write(data[:pause])
        self.wfile.flush()
        if pause < len(data):
            release.wait(STALL_LIMIT)  # stalled until the test ends

    def _status(self, code: int, retry_after: str | None = None) -> None:
        self.send_response(code)
        if retry_after is not None and code in (429, 503):
            self.send_header("Retry-After", retry_after)
        self.send_header("Content-Length", "0")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


def _nth(values: list, index: int):
    return values[min(index, len(values) - 1)]


class HostileServer(ThreadingHTTPServer):
    """Serves ``routes`` on 127.0.0.1; a context manager that stops it (and its stalls)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.routes: dict[str, Route] = {}
        self.hits: list[Hit] = []
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.hit = threading.Event()  # set at each request
        self._thread = threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"

    def requests(self, path: str) -> list[Hit]:
        with self.lock:
            return [hit for hit in self.hits if hit.path == path]

    def __enter__(self) -> HostileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()
        self._thread.join(10)
