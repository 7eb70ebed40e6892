"""One HTTP download read as a stream, resumed where it broke (used by ``HttpReader``).

:class:`Download` is a raw binary stream over the body of one GET. It makes
sure that what it delivers is the whole file, once, in order:

* a body shorter than its ``Content-Length`` (the server closed early), a
  broken chunked encoding, a reset connection or a stall longer than
  ``timeout`` is a *failure*, never an end of file;
* after a failure it asks again, for the rest only (``Range: bytes=N-`` with
  ``If-Range``) when the server advertised ``Accept-Ranges: bytes`` and a
  validator (a strong ``ETag`` or ``Last-Modified``), else for the whole file,
  dropping the bytes already delivered; either way the new response must be
  the same version of the file (same validator and length, the right
  ``Content-Range``; without a validator, the same CRC-32 over the bytes
  already delivered), or the download fails: a file that changed midway is
  never spliced;
* failures are retried ``retries`` times in a row (a retry that makes
  progress starts the count again), with exponential backoff, honouring
  ``Retry-After`` on 429/503; the wait is a single bounded wait on the
  reader's close event, so ``close()`` cuts it short;
* ``deadline`` bounds the time spent waiting on the network for the whole
  download (connecting, reading, backing off; not the time the consumer
  spends between reads), so a server trickling bytes cannot hold a reader
  forever. It is checked between reads, so it may be passed by up to
  ``timeout``.

Every error names the URL. They are all ``OSError``s::

    OSError             an HTTP error status (4xx at once, 5xx/429 after the
                        retries), or the file changed on the server midway
    ├── ConnectionError refused, reset or cut short, after the retries
    └── TimeoutError    stalled longer than ``timeout`` after the retries, or
                        ``deadline`` spent

Example:
    >>> policy = RetryPolicy(timeout=5, retries=0, backoff=0, deadline=10)
    >>> policy
    RetryPolicy(timeout=5, retries=0, backoff=0, deadline=10)
"""

from __future__ import annotations

import dataclasses
import email.utils
import http.client
import io
import random
import re
import threading
import time
import urllib.error
import urllib.request
import zlib
from typing import Any

__all__ = ["Download", "RetryPolicy"]

_RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
_FAILURES = (OSError, http.client.HTTPException)  # URLError is an OSError
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_JITTER = random.Random()  # private: never touches the user's global RNG


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How long to wait and how often to retry; see :class:`HttpReader`."""

    timeout: float | None
    retries: int
    backoff: float
    deadline: float | None


class Download(io.RawIOBase):
    """The body of ``GET url``, resumed after failures; raises ``OSError`` naming the URL.

    The first request is made here, so a bad URL or status fails at once.
    """

    def __init__(
        self, url: str, headers: dict[str, str], policy: RetryPolicy, closing: threading.Event
    ) -> None:
        self.url = url
        self._headers = headers
        self._policy = policy
        self._closing = closing
        self._spent = 0.0  # seconds spent waiting on the network
        self._failures = 0  # failures since the last progress
        self._position = 0  # bytes delivered
        self._skip = 0  # bytes of a restarted response still to drop
        self._length: int | None = None  # from Content-Length
        self._etag: str | None = None
        self._modified: str | None = None
        self._ranges = False
        self._crc: int | None = None  # over the bytes delivered, when there is no validator
        self._skipped_crc = 0
        self._opened = False  # the first response was accepted
        self._response: http.client.HTTPResponse | None = None
        self._response = self._request()

    def readable(self) -> bool:
        return True

    def version(self) -> str | None:
        """The server's word for this version of the file (strong ETag, Last-Modified,
        length), as a resume compares it; None when the server sent none of them."""
        if self._etag is None and self._modified is None and self._length is None:
            return None
        return f"ETag {self._etag}, Last-Modified {self._modified}, {self._length} bytes"

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if not len(view):
            return 0
        if self._response is None:
            raise OSError(f"GET {self.url}: the download failed already; it cannot be read on")
        while True:
            self._check_deadline()
            want = len(view) if not self._skip else min(self._skip, 1 << 16)
            started = time.monotonic()
            try:
                chunk = self._response.read1(want)  # type: ignore[union-attr]
                cause: Any = None
            except _FAILURES as error:
                chunk, cause = b"", error
            finally:
                self._spent += time.monotonic() - started
            if chunk and self._skip:
                self._dropped(chunk)
                continue
            if chunk:
                size = len(chunk)
                view[:size] = chunk
                self._position += size
                self._failures = 0
                if self._crc is not None:
                    self._crc = zlib.crc32(chunk, self._crc)
                return size
            if cause is None:
                if self._skip:
                    cause = f"a restarted body ended before byte {self._position}"
                elif self._length is None or self._position >= self._length:
                    return 0  # the whole body
                else:
                    cause = f"the body ended at byte {self._position} of {self._length}"
            self._close_response()
            self._fail(cause)
            self._response = self._request()

    def close(self) -> None:
        self._close_response()
        super().close()

    # -- requests ------------------------------------------------------------------------------

    def _request(self) -> http.client.HTTPResponse:
        """A response that goes on at ``_position``, after retrying failed requests."""
        while True:
            self._check_deadline()
            resuming = self._opened
            headers = dict(self._headers)
            if resuming and self._ranges:
                headers["Range"] = f"bytes={self._position}-"
                headers["If-Range"] = self._etag or self._modified  # type: ignore[assignment]
            request = urllib.request.Request(self.url, headers=headers)
            retry_after = None
            started = time.monotonic()
            try:
                response = urllib.request.urlopen(request, timeout=self._wait_limit())  # noqa: S310
            except urllib.error.HTTPError as error:
                error.close()
                if error.code not in _RETRY_STATUS:
                    raise OSError(self._status_message(error)) from error
                cause: Any = error
                retry_after = _retry_after(error.headers.get("Retry-After"))
            except _FAILURES as error:
                cause = error
            else:
                try:
                    self._accept(response, resuming)
                except BaseException:
                    response.close()
                    raise
                return response
            finally:
                self._spent += time.monotonic() - started
            self._fail(cause, retry_after)

    def _accept(self, response: http.client.HTTPResponse, resuming: bool) -> None:
        """Check that ``response`` continues the same file at ``_position``."""
        lengths = {value.strip() for value in response.headers.get_all("Content-Length") or ()}
        if len(lengths) > 1:  # http.client would take the first: a cut or padded file
            raise OSError(
                f"GET {self.url}: the response has conflicting Content-Length headers "
                f"{sorted(lengths)}, so the end of the file cannot be told; fix the server "
                f"(or the proxy in front of it)"
            )
        etag = response.headers.get("ETag")
        modified = response.headers.get("Last-Modified")
        if not resuming:
            self._length = response.length
            self._etag = etag if etag and not etag.startswith("W/") else None
            self._modified = modified
            accepts = response.headers.get("Accept-Ranges", "").strip().lower() == "bytes"
            self._ranges = accepts and bool(self._etag or self._modified)
            self._crc = None if self._etag or self._modified else 0
            self._opened = True
            return
        if (self._etag and etag != self._etag) or (self._modified and modified != self._modified):
            raise self._changed(
                f"ETag {self._etag!r} -> {etag!r}, Last-Modified {self._modified!r} -> {modified!r}"
            )
        if response.status == 206:
            match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", ""))
            total = int(match.group(3)) if match and match.group(3) != "*" else None
            if (
                match is None
                or int(match.group(1)) != self._position
                or (self._length is not None and total != self._length)
            ):
                raise self._changed(
                    f"asked for bytes {self._position}- of {self._length}, got Content-Range "
                    f"{response.headers.get('Content-Range')!r}"
                )
            if self._length is None:
                self._length = total
            return
        if response.length != self._length:  # a whole new response: drop what was delivered
            raise self._changed(f"length {self._length} -> {response.length}")
        self._skip, self._skipped_crc = self._position, 0

    def _dropped(self, chunk: bytes) -> None:
        """Bytes of a restarted response that were delivered already: check they are the same."""
        self._skip -= len(chunk)
        if self._crc is None:
            return
        self._skipped_crc = zlib.crc32(chunk, self._skipped_crc)
        if not self._skip and self._skipped_crc != self._crc:
            raise self._changed(f"the first {self._position} bytes differ (CRC-32)")

    # -- failures ------------------------------------------------------------------------------

    def _fail(self, cause: Any, retry_after: float | None = None) -> None:
        """Count a failure; raise when out of retries, else wait before the next attempt."""
        self._failures += 1
        policy = self._policy
        if self._failures > policy.retries:
            raise self._final(cause)
        delay = policy.backoff * 2 ** (self._failures - 1) * (0.5 + _JITTER.random() / 2)
        if retry_after is not None:
            delay = max(delay, retry_after)
        if policy.deadline is not None and self._spent + delay >= policy.deadline:
            raise self._past_deadline(f"the next retry would wait {delay:.1f} s")
        started = time.monotonic()
        closed = self._closing.wait(delay)  # a backoff: the close event cuts it short
        self._spent += time.monotonic() - started
        if closed:
            raise RuntimeError(f"HttpReader was closed while retrying {self.url}")

    def _final(self, cause: Any) -> OSError:
        attempts = self._failures
        tries = f"after {attempts} attempt(s)"
        where = self._where()
        if isinstance(cause, urllib.error.HTTPError):
            return OSError(self._status_message(cause) + f" {tries}")
        reason = getattr(cause, "reason", cause)
        if isinstance(reason, TimeoutError):
            return TimeoutError(
                f"GET {self.url}: no data for {self._policy.timeout} s{where}, {tries}; the "
                f"server stalls: check it, or pass a larger timeout= or retries= to HttpReader"
            )
        if isinstance(cause, str):
            return ConnectionError(
                f"GET {self.url}: {cause}, {tries}; the server or the network cut the "
                f"download short"
            )
        return ConnectionError(
            f"GET {self.url} failed {tries}{where}: {reason}; check that the server is up "
            f"and the URL is right"
        )

    def _check_deadline(self) -> None:
        deadline = self._policy.deadline
        if deadline is not None and self._spent >= deadline:
            raise self._past_deadline(f"{self._spent:.1f} s spent")

    def _past_deadline(self, what: str) -> TimeoutError:
        return TimeoutError(
            f"GET {self.url}: gave up{self._where()}: {what}, past deadline="
            f"{self._policy.deadline} s of network time; the server is too slow (or "
            f"trickles): pass a larger deadline= to HttpReader (or None) for big files or "
            f"slow links"
        )

    def _changed(self, what: str) -> OSError:
        return OSError(
            f"GET {self.url}: the file changed on the server while it was read ({what}); "
            f"its first {self._position} bytes were already delivered, so it cannot be "
            f"resumed: read the epoch again once the file is stable"
        )

    def _status_message(self, error: urllib.error.HTTPError) -> str:
        return f"GET {self.url} failed with HTTP status {error.code} {error.reason}{self._where()}"

    def _where(self) -> str:
        if not self._opened:
            return ""
        return f" at byte {self._position} of {self._length if self._length is not None else '?'}"

    def _wait_limit(self) -> float | None:
        timeout, deadline = self._policy.timeout, self._policy.deadline
        if deadline is None:
            return timeout
        left = max(deadline - self._spent, 0.001)
        return left if timeout is None else min(timeout, left)

    def _close_response(self) -> None:
        response, self._response = self._response, None
        if response is not None:
            response.close()


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (seconds or an HTTP date); None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
