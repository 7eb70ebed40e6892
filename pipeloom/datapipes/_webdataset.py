"""Group consecutive tar members into WebDataset samples (``webdataset``).

Follows the conventions of the ``webdataset`` library: a member's *key* is
its path up to the first dot of its file name, the rest (lower-cased, with its
leading dot) is the field name. Consecutive members sharing a key form one
sample dict ``{"__key__": key, "__url__": shard, ".jpg": bytes, ".cls": bytes}``.
Members without an extension are skipped, as the ``webdataset`` library does.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> members = IterableWrapper([("s.tar/0001.jpg", b"J"), ("s.tar/0001.cls", b"1"),
    ...                            ("s.tar/0002.jpg", b"K")])
    >>> for sample in WebDataset(members):
    ...     print(sample)
    {'__key__': 's.tar/0001', '__url__': 's.tar', '.jpg': b'J', '.cls': b'1'}
    {'__key__': 's.tar/0002', '__url__': 's.tar', '.jpg': b'K'}
"""

from __future__ import annotations

import posixpath
from typing import Any

from ._base import IterDataPipe
from ._context import current_stamp, restore_stamp

__all__ = ["WebDataset", "split_key"]


def split_key(path: str) -> tuple[str, str] | None:
    """``"d/s.tar/x/0001.seg.png"`` → ``("d/s.tar/x/0001", ".seg.png")``; None without a dot.

    >>> split_key("d/s.tar/x/0001.seg.PNG"), split_key("d/README")
    (('d/s.tar/x/0001', '.seg.png'), None)
    """
    directory, name = posixpath.split(path)
    stem, dot, extension = name.partition(".")
    if not dot or not stem:
        return None
    key = f"{directory}/{stem}" if directory else stem
    return key, "." + extension.lower()


class WebDataset(IterDataPipe):
    """Yield one dict per sample from ``(path, bytes)`` tar members. Functional: ``webdataset``.

    ``__url__`` is the shard path when the members come from
    :class:`TarArchiveLoader`, else the key's directory.

    Raises:
        ValueError: when a sample has two members with the same extension.
    """

    per_item = True  # groups never span two shards: runs in workers

    inputs = ("source",)

    def __init__(self, source: IterDataPipe) -> None:
        if not isinstance(source, IterDataPipe):
            raise TypeError(
                f"WebDataset expects an IterDataPipe of (path, bytes), got "
                f"{type(source).__name__}; use FileLister(...).open_files('rb').load_from_tar()"
            )
        self.source = source
        self._sample: dict[str, Any] | None = None
        self._stamp: tuple | None = None
        self._ended = False

    def reset(self) -> None:
        self._sample, self._stamp, self._ended = None, None, False

    def async_next(self) -> dict[str, Any]:
        while not self._ended:
            try:
                item = self.source.async_next()
            except StopIteration:
                self._ended = True
                break
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
                raise TypeError(
                    f"WebDataset expects (path, data) items, got {type(item).__name__} "
                    f"{item!r:.80}; put it after load_from_tar()"
                )
            path, data = item
            parts = split_key(path)
            if parts is None:
                continue
            key, extension = parts
            sample = self._sample
            if sample is not None and sample["__key__"] == key:
                if extension in sample:
                    raise ValueError(
                        f"sample {key!r} has two members with extension {extension!r} "
                        f"(in {sample['__url__']!r}); each field of a sample must be unique"
                    )
                sample[extension] = data
                continue
            shard = getattr(path, "shard", None) or posixpath.dirname(key)
            stamp = current_stamp()
            self._sample = {"__key__": key, "__url__": shard, extension: data}
            done, done_stamp, self._stamp = sample, self._stamp, stamp
            if done is not None:
                restore_stamp(done_stamp)  # type: ignore[arg-type]
                return done
        sample, self._sample = self._sample, None
        if sample is None:
            raise StopIteration
        if self._stamp is not None:
            restore_stamp(self._stamp)
        return sample

    def state_dict(self) -> dict[str, Any]:
        return {"sample": self._sample, "stamp": self._stamp, "ended": self._ended}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._sample = state["sample"]
        self._stamp = tuple(state["stamp"]) if state["stamp"] is not None else None  # type: ignore[assignment]
        self._ended = bool(state["ended"])

    def __repr__(self) -> str:
        return "WebDataset()"
