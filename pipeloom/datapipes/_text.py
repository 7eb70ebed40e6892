"""Text streams: lines (``readlines``) and CSV rows (``parse_csv``).

Both read each ``(path, stream)`` to its end, close it, and resume mid-file
by re-reading it and skipping the items already emitted. Binary streams are
read as UTF-8 by ``parse_csv``; ``readlines`` yields ``bytes`` lines for them.

Example:
    >>> import io
    >>> from pipeloom.datapipes import IterableWrapper
    >>> files = IterableWrapper([("a.csv", io.StringIO("x,y\\n1,2\\n3,4\\n"))])
    >>> list(CSVParser(files, as_dict=True))
    [{'x': '1', 'y': '2'}, {'x': '3', 'y': '4'}]
"""

from __future__ import annotations

import csv
import io
import itertools
from collections.abc import Iterator
from typing import IO, Any

from .._validate import check_bool, check_int
from ._base import IterDataPipe
from ._files import StreamReader

__all__ = ["CSVParser", "LineReader"]


class LineReader(StreamReader):
    """Yield the lines of each ``(path, stream)``. Functional: ``readlines``.

    Args:
        source: a block yielding ``(path, stream)``.
        strip_newline: remove the trailing ``"\\n"``/``"\\r\\n"``.
        return_path: yield ``(path, line)``; False yields the line alone.

    Example:
        >>> import io
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(LineReader(IterableWrapper([("f", io.StringIO("a\\nb\\n"))])))
        [('f', 'a'), ('f', 'b')]
    """

    def __init__(
        self, source: IterDataPipe, *, strip_newline: bool = True, return_path: bool = True
    ) -> None:
        super().__init__(source)
        self.strip_newline = check_bool("strip_newline", strip_newline)
        self.return_path = check_bool("return_path", return_path)

    def _read(self, path: str, stream: IO[Any], skip: int) -> Iterator[Any]:
        lines = itertools.islice(stream, skip, None)
        for line in lines:
            if self.strip_newline:
                line = line.rstrip(b"\r\n" if isinstance(line, bytes) else "\r\n")
            yield (path, line) if self.return_path else line

    def __repr__(self) -> str:
        return f"LineReader(strip_newline={self.strip_newline}, return_path={self.return_path})"


class CSVParser(StreamReader):
    """Yield the rows of each ``(path, stream)`` of CSV text. Functional: ``parse_csv``.

    Args:
        source: a block yielding ``(path, stream)`` (text or binary UTF-8).
        delimiter: the one-character field separator.
        skip_lines: lines to skip at the start of each file (before any header).
        as_dict: read the first row as a header and yield dicts keyed by it.
        return_path: yield ``(path, row)`` instead of the row.

    Example:
        >>> import io
        >>> from pipeloom.datapipes import IterableWrapper
        >>> files = IterableWrapper([("t.tsv", io.StringIO("# comment\\n1\\t2\\n"))])
        >>> list(CSVParser(files, delimiter="\\t", skip_lines=1, return_path=True))
        [('t.tsv', ['1', '2'])]
    """

    def __init__(
        self,
        source: IterDataPipe,
        *,
        delimiter: str = ",",
        skip_lines: int = 0,
        as_dict: bool = False,
        return_path: bool = False,
    ) -> None:
        super().__init__(source)
        if not isinstance(delimiter, str) or len(delimiter) != 1:
            raise ValueError(f"delimiter must be a 1-character string, got {delimiter!r}")
        check_int("skip_lines", skip_lines, minimum=0)
        self.delimiter = delimiter
        self.skip_lines = skip_lines
        self.as_dict = check_bool("as_dict", as_dict)
        self.return_path = check_bool("return_path", return_path)

    def _read(self, path: str, stream: IO[Any], skip: int) -> Iterator[Any]:
        text = (
            stream
            if isinstance(stream, io.TextIOBase)
            else io.TextIOWrapper(
                stream,
                encoding="utf-8",
                newline="",  # type: ignore[arg-type]
            )
        )
        for _ in range(self.skip_lines):
            if not text.readline():
                return
        if self.as_dict:
            rows: Iterator[Any] = csv.DictReader(text, delimiter=self.delimiter)
        else:
            rows = csv.reader(text, delimiter=self.delimiter)
        try:
            for row in itertools.islice(rows, skip, None):
                yield (path, row) if self.return_path else row
        except csv.Error as error:
            raise ValueError(f"malformed CSV in {path!r}: {error}") from error

    def __repr__(self) -> str:
        return (
            f"CSVParser(delimiter={self.delimiter!r}, skip_lines={self.skip_lines}, "
            f"as_dict={self.as_dict}, return_path={self.return_path})"
        )
