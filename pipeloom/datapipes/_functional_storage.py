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

    def list_files_by_fsspec(
        self, masks: str | Sequence[str] = "", *, recursive: bool = False, **kwargs: Any
    ) -> IterDataPipe:
        """List the files under each incoming fsspec URL. See :class:`FSSpecRootLister`."""
        from ._list_files import FSSpecRootLister

        return FSSpecRootLister(self, masks, recursive=recursive, **kwargs)

    # -- opening and reading streams -------------------------------------------------
    def open_files_by_fsspec(
        self, mode: str = "r", *, kwargs_for_open: dict[str, Any] | None = None, **kwargs: Any
    ) -> IterDataPipe:
        """Open each fsspec URL; yield ``(url, stream)``. See :class:`FSSpecFileOpener`.

        ``kwargs_for_open`` go to the file system's ``open`` (an ``encoding``
        there sets the text encoding); ``kwargs`` are storage options.
        """
        from ._fsspec import FSSpecFileOpener

        open_kwargs = dict(kwargs_for_open or {})
        encoding = open_kwargs.pop("encoding", None)
        return FSSpecFileOpener(
            self, mode, encoding=encoding, kwargs_for_open=open_kwargs, **kwargs
        )

    def read_from_http(
        self,
        timeout: float | None = 30.0,
        skip_on_error: bool = False,
        *,
        retries: int = 3,
        backoff: float = 0.5,
        deadline: float | None = 600.0,
        **kwargs: Any,
    ) -> IterDataPipe:
        """GET each URL; yield ``(url, stream)``. See :class:`HttpReader`.

        torchdata's arguments: ``timeout`` and, of the ``requests`` keyword
        arguments, ``headers``; and :class:`HttpReader`'s ``retries``,
        ``backoff`` and ``deadline``, with its defaults. ``timeout`` is 30 s
        as in :class:`HttpReader` (torchdata's None waited forever on a server
        that stops sending; None here still stops at ``deadline``). pipeloom
        retries failed requests and raises the last error, so
        ``skip_on_error=True`` is refused with how to port it.
        """
        from ._http import HttpReader

        if skip_on_error:
            raise ValueError(
                "read_from_http(skip_on_error=True) is not supported: pipeloom retries a failed "
                "request and then raises, so no URL is dropped silently. Check the URLs before "
                "(e.g. .filter(...)), or catch the error around the loop"
            )
        headers = kwargs.pop("headers", None)
        if kwargs:
            raise TypeError(
                f"read_from_http() takes timeout=, headers=, retries=, backoff= and deadline= "
                f"only (pipeloom uses urllib, not requests), got {sorted(kwargs)}; authenticate "
                f"with headers, e.g. headers={{'Authorization': 'Bearer ...'}}"
            )
        return HttpReader(
            self,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            headers=headers,
            deadline=deadline,
        )

    def read_from_remote(self, *args: Any, **kwargs: Any) -> IterDataPipe:
        """torchdata's ``OnlineReader`` (HTTP or Google Drive): refused; use ``read_from_http``."""
        raise NotImplementedError(
            "read_from_remote() read HTTP(S) URLs and Google Drive links; pipeloom reads HTTP(S) "
            "URLs with .read_from_http(timeout=..., headers=...) and has no Google Drive reader "
            "(download such files first, or open them through fsspec with "
            ".open_files_by_fsspec())"
        )

    def read_from_stream(self, chunk: int | None = None) -> IterDataPipe:
        """Yield ``(path, chunk)`` reads of each stream. See :class:`StreamChunkReader`."""
        from ._read_stream import StreamChunkReader

        return StreamChunkReader(self, chunk)

    def check_hash(
        self, hash_dict: dict[str, str], hash_type: str = "sha256", rewind: bool = True
    ) -> IterDataPipe:
        """Check each ``(path, data)``'s digest. See :class:`HashChecker`."""
        from ._hash import HashChecker

        return HashChecker(self, hash_dict, hash_type=hash_type, rewind=rewind)

    # -- archives and compression ------------------------------------------------------
    def load_from_zip(self, length: int = -1) -> IterDataPipe:
        """Yield ``(path, stream)`` for each member of each zip. See :class:`ZipArchiveLoader`."""
        from ._zip_archive import ZipArchiveLoader

        return ZipArchiveLoader(self, length)

    def load_from_bz2(self, length: int = -1) -> IterDataPipe:
        """Decompress each bzip2 ``(path, stream)``. See :class:`Bz2FileLoader`."""
        from ._decompress import Bz2FileLoader

        return Bz2FileLoader(self, length)

    def load_from_xz(self, length: int = -1) -> IterDataPipe:
        """Decompress each xz ``(path, stream)``. See :class:`XzFileLoader`."""
        from ._decompress import XzFileLoader

        return XzFileLoader(self, length)

    def decompress(self, file_type: str | None = None) -> IterDataPipe:
        """Decompress each ``(path, stream)``. See :class:`Decompressor`."""
        from ._decompress import Decompressor

        return Decompressor(self, file_type)

    def extract(self, file_type: str | None = None) -> IterDataPipe:
        """The same as :meth:`decompress` (torchdata had both names)."""
        from ._decompress import Decompressor

        return Decompressor(self, file_type)

    def load_from_tfrecord(
        self,
        spec: dict[str, tuple[Any, Any]] | None = None,
        length: int = -1,
        *,
        verify_data: bool = True,
    ) -> IterDataPipe:
        """Yield each TFRecord record as a dict of features. See :class:`TFRecordLoader`."""
        from ._tfrecord import TFRecordLoader

        return TFRecordLoader(self, spec, length, verify_data=verify_data)

    # -- saving ------------------------------------------------------------------------
    def save_to_disk(
        self, mode: str = "w", filepath_fn: Callable[[Any], Any] | None = None
    ) -> IterDataPipe:
        """Write each ``(path, data)`` to a local file; yield its path. See :class:`Saver`."""
        from ._save import Saver

        return Saver(self, mode, filepath_fn)

    def save_by_fsspec(
        self,
        mode: str = "w",
        filepath_fn: Callable[[Any], Any] | None = None,
        *,
        kwargs_for_open: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> IterDataPipe:
        """Write each ``(path, data)`` to an fsspec URL; yield it. See :class:`FSSpecSaver`."""
        from ._save import FSSpecSaver

        return FSSpecSaver(self, mode, filepath_fn, kwargs_for_open=kwargs_for_open, **kwargs)

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

    def routed_decode(
        self, *handlers: Callable[[str, bytes], Any], key_fn: Callable[[str], str] | None = None
    ) -> IterDataPipe:
        """Decode ``(path, data)`` by handlers chosen by extension. See :class:`RoutedDecoder`."""
        from ._routed_decode import RoutedDecoder, extension_of

        return RoutedDecoder(self, *handlers, key_fn=extension_of if key_fn is None else key_fn)
