"""Stream files over HTTP(S) with ``urllib`` (``HttpReader``).

Each URL is requested when it is reached and yielded as ``(url, response)``;
the response is a streaming binary file object (read it, e.g. with
``load_from_tar()``, without downloading it first). Failed requests are retried
with exponential backoff on connection errors, timeouts, HTTP 5xx and 429; the
wait between attempts is an interruptible ``threading.Event`` wait, cut short
by ``close()``.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> HttpReader(IterableWrapper(["http://127.0.0.1:9/x.tar"]), timeout=5, retries=2)
    HttpReader(timeout=5, retries=2, backoff=0.5, headers=None)
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from typing import IO, Any

from .._validate import check_int, check_seconds
from ._base import IterDataPipe
from ._files import StreamOpener

__all__ = ["HttpReader"]

_RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class HttpReader(StreamOpener):
    """Open each URL with an HTTP GET; yield ``(url, stream)``.

    Shardable like :class:`FileOpener`; responses still open are closed on
    ``reset()``/``close()``.

    Args:
        source: a block yielding ``http://`` / ``https://`` URLs.
        timeout: seconds to wait to connect and for each read; None waits forever.
        retries: how many times to retry a failed request (so ``retries + 1``
            attempts) on connection errors, timeouts, 5xx and 429.
        backoff: the first wait between attempts in seconds, doubled each time.
        headers: extra request headers.

    Raises:
        OSError: naming the URL and the HTTP status (4xx at once, 5xx after the
            retries) or the connection error (after the retries).
    """

    def __init__(
        self,
        source: IterDataPipe,
        timeout: float | None = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(source)
        check_seconds("timeout", timeout, allow_none=True)
        check_int("retries", retries, minimum=0, hint="use 0 for no retry")
        check_seconds("backoff", backoff, zero_ok=True)
        if headers is not None and not (
            isinstance(headers, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
        ):
            raise TypeError(f"headers must be a dict of str to str, got {headers!r}")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
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
        request = urllib.request.Request(path, headers=self.headers or {})
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                return urllib.request.urlopen(request, timeout=self.timeout)  # noqa: S310
            except urllib.error.HTTPError as error:
                error.close()
                if error.code not in _RETRY_STATUS or last:
                    tries = f" after {attempt + 1} attempts" if attempt else ""
                    raise OSError(
                        f"GET {path} failed with HTTP status {error.code} {error.reason}{tries}"
                    ) from error
            except (urllib.error.URLError, OSError) as error:
                if last:
                    cause = getattr(error, "reason", error)
                    raise ConnectionError(
                        f"GET {path} failed after {attempt + 1} attempt(s): {cause}; check "
                        f"that the server is up and the URL is right"
                    ) from error
            if closing.wait(self.backoff * 2**attempt):
                raise RuntimeError(f"HttpReader was closed while retrying {path}")
        raise AssertionError("unreachable")  # pragma: no cover

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
            f"backoff={self.backoff}, headers={self.headers!r})"
        )
