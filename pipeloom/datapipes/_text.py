"""Text streams: lines (``readlines``) and CSV rows (``parse_csv``, ``parse_csv_as_dict``).

Both take torchdata 0.9's arguments with the same meaning. Each
``(path, stream)`` is read line by line: the first ``skip_lines`` lines are
dropped, a binary stream is decoded when ``decode`` is true (``readlines``
keeps bytes by default, ``parse_csv`` decodes; see :func:`text_lines`), and the
stream is closed at its end. A resumed pipeline re-reads the stream and skips the items already
emitted. A ``(path, bytes)`` item (e.g. a tar member) is read like a stream.

Example:
    >>> import io
    >>> from pipeloom.datapipes import IterableWrapper
    >>> files = IterableWrapper([("a.csv", io.StringIO("x,y\\n1,2\\n3,4\\n"))])
    >>> list(CSVParser(files, as_dict=True))
    [{'x': '1', 'y': '2'}, {'x': '3', 'y': '4'}]
"""

from __future__ import annotations

import codecs
import csv
import itertools
import re
from collections.abc import Iterator
from typing import IO, Any

from .._validate import check_bool, check_int
from ._base import IterDataPipe
from ._files import StreamReader

__all__ = ["CSVParser", "LineReader"]


def check_skip_lines(skip_lines: Any) -> int:
    """Raise ValueError unless ``skip_lines`` is an int >= 0."""
    return check_int("skip_lines", skip_lines, minimum=0)


def check_codec(encoding: Any, errors: Any) -> tuple[str, str]:
    """Raise unless ``encoding`` names a codec and ``errors`` is an error handler name."""
    if not isinstance(encoding, str):
        raise TypeError(f"encoding must be a str such as 'utf-8', got {encoding!r}")
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise ValueError(f"unknown encoding {encoding!r}; use e.g. 'utf-8' or 'latin-1'") from None
    if not isinstance(errors, str):
        raise TypeError(f"errors must be a str such as 'ignore' or 'strict', got {errors!r}")
    try:
        codecs.lookup_error(errors)
    except LookupError:
        raise ValueError(
            f"unknown errors handler {errors!r}; use 'strict', 'ignore' or 'replace'"
        ) from None
    return encoding, errors


def text_lines(
    stream: IO[Any],
    skip_lines: int,
    decode: bool,
    encoding: str,
    errors: str,
    *,
    csv_newlines: bool = False,
) -> Iterator[Any]:
    """The lines of ``stream`` after the first ``skip_lines``, decoded if asked.

    A binary stream is decoded as one text, so that its lines are those of
    ``open(path, encoding=encoding, errors=errors, newline="\\n")`` (with
    ``csv_newlines``: ``newline=""``, as the ``csv`` module asks; a lone ``"\\r"``
    ends a line too). Without ``decode``, a binary stream gives ``bytes`` lines.
    """
    lines: Iterator[Any]
    if decode and isinstance(stream.read(0), (bytes, bytearray)):
        lines = _decoded_lines(stream, encoding, errors, csv_newlines)
    else:
        lines = iter(stream)
    next(itertools.islice(lines, skip_lines, skip_lines), None)
    return lines


_CSV_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)")
_BLOCK = 1 << 16


def _decoded_lines(stream: IO[bytes], encoding: str, errors: str, cr: bool) -> Iterator[str]:
    """The lines of a binary stream, decoded in blocks by one incremental decoder.

    Decoding each ``b"\\n"``-ended bytes line on its own cut the characters of
    encodings whose newline is more than that byte (UTF-16, UTF-32), and a CSV
    file with lone ``"\\r"`` line ends (old Mac spreadsheets) was one long line.
    """
    decoder = codecs.getincrementaldecoder(encoding)(errors)
    read = getattr(stream, "read1", stream.read)  # what is there: a slow stream's lines flow
    pending = ""
    while True:
        block = read(_BLOCK)
        final = not block
        text = pending + decoder.decode(block, final)
        if cr and text.count("\r") != text.count("\r\n"):  # a lone "\r" (rare)
            lines = _CSV_LINE.findall(text)
            done = sum(map(len, lines))
            if lines and not final and done == len(text) and text[-1] == "\r":
                done -= len(lines.pop())  # a "\r" that the next block may follow with "\n"
        else:
            lines = text.split("\n")
            last = lines.pop()
            lines = [line + "\n" for line in lines]
            done = len(text) - len(last)
        yield from lines
        pending = text[done:]
        if final:
            if pending:
                yield pending
            return


class LineReader(StreamReader):
    """Yield the lines of each ``(path, stream)``. Functional: ``readlines``.

    Args:
        source: a block yielding ``(path, stream)``.
        skip_lines: lines to drop at the start of each stream.
        strip_newline: remove ``"\\r"``/``"\\n"`` at both ends of each line.
        decode: decode a binary stream with ``encoding`` (its lines end at ``"\\n"``).
        encoding: the text encoding used by ``decode``.
        errors: what ``decode`` does with invalid bytes (``"ignore"``,
            ``"strict"``, ``"replace"``...).
        return_path: yield ``(path, line)``; False yields the line alone.

    Example:
        >>> import io
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(LineReader(IterableWrapper([("f", io.StringIO("a\\nb\\n"))])))
        [('f', 'a'), ('f', 'b')]
        >>> list(IterableWrapper([("f", io.BytesIO(b"#\\nx\\n"))]).readlines(
        ...     skip_lines=1, decode=True, return_path=False))
        ['x']
    """

    def __init__(
        self,
        source: IterDataPipe,
        *,
        skip_lines: int = 0,
        strip_newline: bool = True,
        decode: bool = False,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = True,
    ) -> None:
        super().__init__(source)
        self.skip_lines = check_skip_lines(skip_lines)
        self.strip_newline = check_bool("strip_newline", strip_newline)
        self.decode_bytes = check_bool("decode", decode)
        self.encoding, self.errors = check_codec(encoding, errors)
        self.return_path = check_bool("return_path", return_path)

    def _read(self, path: str, stream: IO[Any], skip: int) -> Iterator[Any]:
        lines = text_lines(stream, self.skip_lines, self.decode_bytes, self.encoding, self.errors)
        for line in itertools.islice(lines, skip, None):
            if self.strip_newline:
                line = line.strip(b"\r\n" if isinstance(line, bytes) else "\r\n")
            yield (path, line) if self.return_path else line

    def __repr__(self) -> str:
        return f"LineReader({_text_args(self)}, strip_newline={self.strip_newline})"


class CSVParser(StreamReader):
    """Yield the rows of each ``(path, stream)`` of CSV text.

    Functional: ``parse_csv`` (rows as lists) and ``parse_csv_as_dict`` (the
    first row of each file is the header; rows as dicts keyed by it).

    Args:
        source: a block yielding ``(path, stream)`` (text, or binary).
        skip_lines: lines to drop at the start of each file (before any header).
        decode: decode a binary stream with ``encoding``/``errors`` (its lines end as
            ``open(newline="")`` ends them: ``"\\r\\n"``, ``"\\n"`` or ``"\\r"``).
        encoding: the text encoding used by ``decode``.
        errors: what ``decode`` does with invalid bytes.
        return_path: yield ``(path, row)`` instead of the row.
        as_tuple: yield rows as tuples instead of lists.
        as_dict: read the first row as a header and yield dicts keyed by it.
        delimiter: the one-character field separator.
        **fmtparams: further ``csv`` format parameters (``quotechar``,
            ``skipinitialspace``...).

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
        skip_lines: int = 0,
        decode: bool = True,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = False,
        as_tuple: bool = False,
        as_dict: bool = False,
        delimiter: str = ",",
        **fmtparams: Any,
    ) -> None:
        super().__init__(source)
        if not isinstance(delimiter, str) or len(delimiter) != 1:
            raise ValueError(f"delimiter must be a 1-character string, got {delimiter!r}")
        self.skip_lines = check_skip_lines(skip_lines)
        self.decode_bytes = check_bool("decode", decode)
        self.encoding, self.errors = check_codec(encoding, errors)
        self.return_path = check_bool("return_path", return_path)
        self.as_tuple = check_bool("as_tuple", as_tuple)
        self.as_dict = check_bool("as_dict", as_dict)
        if as_tuple and as_dict:
            raise ValueError(
                "as_tuple=True and as_dict=True contradict each other: rows are either tuples "
                "or dicts; use parse_csv(as_tuple=True) or parse_csv_as_dict()"
            )
        self.delimiter = delimiter
        self.fmtparams = {"delimiter": delimiter, **fmtparams}
        try:
            csv.reader([], **self.fmtparams)
        except TypeError as error:
            raise TypeError(
                f"parse_csv() got CSV format parameters {fmtparams!r} that the csv module "
                f"rejects: {error}; see the csv module's Dialects and Formatting Parameters"
            ) from None

    def _read(self, path: str, stream: IO[Any], skip: int) -> Iterator[Any]:
        lines = text_lines(
            stream,
            self.skip_lines,
            self.decode_bytes,
            self.encoding,
            self.errors,
            csv_newlines=True,
        )
        # One sentinel line after the file: it comes back as a row of its own unless
        # the file ended inside a quoted field (a cut file), which swallows it. csv reads
        # no line ahead, so only rows returned once it was handed out need a look.
        handed: list[bool] = []
        lines = itertools.chain(lines, _sentinel(handed))
        reader = csv.DictReader if self.as_dict else csv.reader
        rows: Any = reader(lines, **self.fmtparams)  # has line_num
        try:
            for row in itertools.islice(rows, skip, None):
                if handed and _at_end(row, path, rows.line_num - 1 + self.skip_lines):
                    return
                if self.as_tuple:
                    row = tuple(row)
                yield (path, row) if self.return_path else row
        except csv.Error as error:
            hint = " (the stream gives bytes: pass decode=True)" if "bytes" in str(error) else ""
            raise ValueError(f"malformed CSV in {path!r}: {error}{hint}") from error

    def __repr__(self) -> str:
        shape = "as_dict=True" if self.as_dict else f"as_tuple={self.as_tuple}"
        extra = "".join(f", {k}={v!r}" for k, v in self.fmtparams.items() if k != "delimiter")
        return f"CSVParser({_text_args(self)}, delimiter={self.delimiter!r}, {shape}{extra})"


_END = "\x00pipeloom: end of the CSV file\x00"


def _sentinel(handed: list[bool]) -> Iterator[str]:
    handed.append(True)
    yield _END + "\n"


def _at_end(row: Any, path: str, last_line: int) -> bool:
    """True for the sentinel's own row; raise if ``row`` swallowed it (an open quote)."""
    fields = list(row.values()) if isinstance(row, dict) else row
    if fields[:1] == [_END]:
        return True
    if any(isinstance(field, str) and field.endswith(_END + "\n") for field in fields):
        raise ValueError(
            f"malformed CSV in {path!r}: the file ends (line {last_line}) inside a quoted "
            f"field: is it cut short, or a quote not closed?"
        )
    return False


def _text_args(block: Any) -> str:
    text = f"skip_lines={block.skip_lines}, decode={block.decode_bytes}"
    if block.decode_bytes and (block.encoding, block.errors) != ("utf-8", "ignore"):
        text += f", encoding={block.encoding!r}, errors={block.errors!r}"
    return text + f", return_path={block.return_path}"
