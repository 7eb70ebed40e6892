"""A live progress line: tqdm when installed, else one plain line rewritten in place."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

__all__ = ["Progress"]

_EVERY = 0.2  # seconds between two redraws of the plain line


class Progress:
    """Counts outputs and items; shows items/s, batches and the loader's readiness.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> with Progress("demo", total=2, stream=out, use_tqdm=False) as bar:
        ...     bar.update(items=4, readiness=None)
        ...     bar.update(items=4, readiness=0.5)
        >>> "2/2 batches" in out.getvalue()
        True
    """

    def __init__(
        self,
        label: str,
        *,
        total: int | None = None,
        stream: TextIO | None = None,
        use_tqdm: bool = True,
    ) -> None:
        self.label = label
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.batches = 0
        self.items = 0
        self.readiness: float | None = None
        self._started = time.perf_counter()
        self._drawn = 0.0
        self._bar: Any = None
        if use_tqdm:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, desc=label, unit="batch", file=self.stream)

    def update(self, *, items: int, readiness: float | None) -> None:
        """One more output of ``items`` items."""
        self.batches += 1
        self.items += items
        self.readiness = readiness
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix_str(self._figures(), refresh=False)
            return
        now = time.perf_counter()
        if now - self._drawn >= _EVERY or self.batches == self.total:
            self._drawn = now
            self._draw()

    def _figures(self) -> str:
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        ready = "" if self.readiness is None else f", ready {self.readiness:.0%}"
        return f"{self.items / elapsed:,.0f} items/s{ready}"

    def _draw(self) -> None:
        total = f"/{self.total}" if self.total is not None else ""
        line = f"{self.label}: {self.batches}{total} batches, {self._figures()}"
        self.stream.write("\r" + line.ljust(72))
        self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            return
        self._draw()
        self.stream.write("\n")
        self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
