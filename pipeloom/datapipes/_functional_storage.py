"""Chaining methods for storage and file formats (a mixin of ``IterFunctional``).

Listing, opening, archives, compression, hashing, saving and the text and
JSON formats torchdata 0.9 had, with its arguments. Each method builds the
block it names with ``self`` as its input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._base import IterDataPipe

__all__ = ["StorageFunctional"]


class StorageFunctional:
    """Storage and format methods of every ``IterDataPipe``."""

    # -- listing -------------------------------------------------------------------
    def list_files(
        self,
        masks: str | Sequence[str] = "",
        *,
        recursive: bool = False,
        abspath: bool = False,
        non_deterministic: bool = False,
        length: int = -1,
    ) -> IterDataPipe:
        """List the files under each incoming root path. See :class:`RootLister`."""
        from ._list_files import RootLister

        return RootLister(
            self,
            masks,
            recursive=recursive,
            abspath=abspath,
            non_deterministic=non_deterministic,
            length=length,
        )

    # -- formats -------------------------------------------------------------------
    def lines_to_paragraphs(self, joiner: Callable[[list[Any]], Any] | None = None) -> IterDataPipe:
        """Join runs of non-empty ``(path, line)`` items. See :class:`ParagraphAggregator`."""
        from ._paragraphs import ParagraphAggregator, join_lines

        return ParagraphAggregator(self, join_lines if joiner is None else joiner)

    def parse_csv_as_dict(
        self,
        *,
        skip_lines: int = 0,
        decode: bool = True,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = False,
        delimiter: str = ",",
        **fmtparams: Any,
    ) -> IterDataPipe:
        """Yield each CSV row as a dict keyed by its file's header. See :class:`CSVParser`."""
        from ._text import CSVParser

        return CSVParser(
            self,
            skip_lines=skip_lines,
            decode=decode,
            encoding=encoding,
            errors=errors,
            return_path=return_path,
            as_dict=True,
            delimiter=delimiter,
            **fmtparams,
        )

    def parse_json_files(self, **kwargs: Any) -> IterDataPipe:
        """Parse each ``(path, stream)`` as one JSON document. See :class:`JsonParser`."""
        from ._json import JsonParser

        return JsonParser(self, **kwargs)
