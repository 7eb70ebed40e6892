"""Stream files over HTTP(S) with ``urllib`` (``HttpReader``).

Each URL is requested when it is reached and yielded as ``(url, stream)``;
the stream is a buffered binary file object over a :class:`Download` (read
it, e.g. with ``load_from_tar()``, without downloading it first). The
download delivers the whole file once or raises an ``OSError`` naming the
URL: a body cut short, a broken chunked encoding, a reset or a stall is
retried, resumed with a ``Range`` request where the server allows it, and
checked to be the same version of the file (see ``_download.py``).

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> HttpReader(IterableWrapper(["http://127.0.0.1:9/x.tar"]), timeout=5, retries=2)
    HttpReader(timeout=5, retries=2, backoff=0.5, deadline=600.0, headers=None)
"""

from __future__ import annotations

import io
import threading
from typing import IO, Any

from .._validate import check_int, check_seconds
from ._base import IterDataPipe
from ._download import Download, RetryPolicy
from ._files import StreamOpener

__all__ = ["HttpReader"]


class HttpReader(StreamOpener):
    """Open each URL with an HTTP GET; yield ``(url, stream)``.

    Shardable like :class:`FileOpener`; responses still open are closed on
    ``reset()``/``close()``.

    Args:
        source: a block yielding ``http://`` / ``https://`` URLs.
        timeout: seconds a connection or a read may wait for data before the
            attempt fails (a stall); None waits forever.
        retries: how many times in a row to retry a failed request or a
            broken body (so ``retries + 1`` attempts; progress resets the
            count): connection errors, stalls, bodies cut short, 5xx and 429.
        backoff: the first wait between attempts in seconds, doubled each
            time (with jitter); a ``Retry-After`` header is honoured.
        deadline: the most seconds one URL may spend waiting on the network,
            all attempts together (connecting, reading, backing off; the time
            the consumer takes between reads does not count); None for no
            limit. Raise it for very large files or slow links.
        headers: extra request headers.

    Raises:
        OSError: naming the URL: the HTTP status (4xx at once, 5xx and 429
            after the retries), or the file changed on the server midway.
        ConnectionError: the connection failed or broke, after the retries.
        TimeoutError: a stall after the retries, or ``deadline`` spent.
    """

    per_rank_fields = ("timeout", "retries", "backoff", "deadline")

    def __init__(
        self,
        source: IterDataPipe,
        timeout: float | None = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        headers: dict[str, str] | None = None,
        deadline: float | None = 600.0,
    ) -> None:
        super().__init__(source)
        check_seconds("timeout", timeout, allow_none=True)
        check_int("retries", retries, minimum=0, hint="use 0 for no retry")
        check_seconds("backoff", backoff, zero_ok=True)
        check_seconds("deadline", deadline, allow_none=True)
        if headers is not None and not (
            isinstance(headers, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
        ):
            raise TypeError(f"headers must be a dict of str to str, got {headers!r}")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.deadline = deadline
        self.headers = headers
        self._closing: threading.Event | None = None

    def _check(self, path: Any) -> str:
        url = super()._check(path)
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"HttpReader expects http:// or https:// URLs, got {url!r}")
        return url

    def _open(self, path: str) -> IO[bytes]:
        closing = self._closing
        if closing is None:
            closing = self._closing = threading.Event()
        policy = RetryPolicy(self.timeout, self.retries, self.backoff, self.deadline)
        return io.BufferedReader(Download(path, dict(self.headers or {}), policy, closing))

    def _version(self, stream: IO[Any]) -> str | None:
        download = getattr(stream, "raw", None)
        return download.version() if isinstance(download, Download) else None

    def close(self) -> None:
        """Close open responses and interrupt a retry wait in progress."""
        if self._closing is not None:
            self._closing.set()
        super().close()

    def reset(self) -> None:
        super().reset()
        self._closing = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_closing"] = None
        return state

    def __repr__(self) -> str:
        return (
            f"HttpReader(timeout={self.timeout}, retries={self.retries}, "
            f"backoff={self.backoff}, deadline={self.deadline}, headers={self.headers!r})"
        )
