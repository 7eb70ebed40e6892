"""Group consecutive tar members into WebDataset samples (``webdataset``).

The sample dicts are the ``webdataset`` library's, so code written for it
works unchanged: a member's *key* is its path inside the shard up to the
first dot of its file name, the rest (lower-cased, without the dot) is the
field. Consecutive members of one shard sharing a key form one sample::

    {"__key__": "part/0001", "__url__": "data/s0.tar", "__local_path__": "data/s0.tar",
     "jpg": b"...", "cls": b"3"}

``__url__`` is the shard's path or URL, ``__local_path__`` its path when it is
a local file (as the library sets it). Members without an extension, and
metadata members (``__name__`` at the top of the shard, or under a
``__name__/`` directory), are skipped, as the library does.

A shard whose rest ``load_from_tar(on_error="skip"|"warn")`` dropped (damaged
or truncated) ends without its last sample: the members after the damage may
have been its fields, so it is dropped rather than given without them.

Example:
    >>> from pipeloom.datapipes import IterableWrapper
    >>> members = IterableWrapper([("https://h/s.tar/0001.jpg", b"J"),
    ...                            ("https://h/s.tar/0001.cls", b"1"),
    ...                            ("https://h/s.tar/0002.jpg", b"K")])
    >>> for sample in WebDataset(members):
    ...     print(sample)
    {'__key__': '0001', '__url__': 'https://h/s.tar', 'jpg': b'J', 'cls': b'1'}
    {'__key__': '0002', '__url__': 'https://h/s.tar', 'jpg': b'K'}
"""

from __future__ import annotations

import posixpath
import re
import urllib.parse
from typing import Any

from ..errors import NotAvailable, StateError
from ._base import IterDataPipe
from ._context import current_stamp, key_position, restore_stamp
from ._names import is_url
from ._state_fields import StateFields

__all__ = ["WebDataset", "split_key", "split_shard"]

_KEY = re.compile(r"((?:.*/)?[^.]+)\.([^/]*)")  # the key, a dot, the extension
_META = re.compile(r"__[^/]*__($|/)")  # metadata members, skipped
_TAR = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


def split_key(member: str) -> tuple[str, str] | None:
    """``"x/0001.seg.PNG"`` → ``("x/0001", "seg.png")``; None without an extension.

    >>> split_key("x/0001.seg.PNG"), split_key("README")
    (('x/0001', 'seg.png'), None)
    """
    match = _KEY.fullmatch(member)
    if match is None:
        return None
    return match.group(1), match.group(2).lower()


def split_shard(path: str) -> tuple[str, str]:
    """``(shard, member)`` of a member path from ``load_from_tar``.

    A :class:`TarMemberPath` knows its shard. A plain ``str`` is split after
    its last component that names a tar file, else after its directory.

    >>> split_shard("data/s.tar/x/0001.jpg"), split_shard("data/0001.jpg")
    (('data/s.tar', 'x/0001.jpg'), ('data', '0001.jpg'))
    """
    shard = getattr(path, "shard", None)
    if shard is not None:
        return shard, path.member  # type: ignore[attr-defined]
    parts = path.split("/")
    url = is_url(path)  # then "s.tar?sig=abc" (a signed URL's query) names a tar file
    for index in range(len(parts) - 2, -1, -1):
        name = re.split("[?#]", parts[index], maxsplit=1)[0] if url else parts[index]
        if name.lower().endswith(_TAR):
            return "/".join(parts[: index + 1]), "/".join(parts[index + 1 :])
    directory, name = posixpath.split(path)
    return directory, name


def _local_path(url: str) -> str | None:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "":  # a path: "#", "?" and ";" are characters of its file name
        return url
    return parsed.path if parsed.scheme == "file" else None


class WebDataset(IterDataPipe):
    """Yield one dict per sample from ``(path, bytes)`` tar members. Functional: ``webdataset``.

    Raises:
        ValueError: when a sample has two members with the same extension.
    """

    per_item = True  # groups never span two shards: runs in workers...
    groups_expanded_items = True  # ...when a tar reader below the sharding point made them

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
        self._error: Exception | None = None  # raised after the sample before it

    def reset(self) -> None:
        self._sample, self._stamp, self._ended, self._error = None, None, False, None

    def _cut_short(self, sample: dict[str, Any]) -> bool:
        """Whether ``sample`` (ended by its shard's end) may lack members: the tar loader
        dropped the rest of its shard."""
        cut: Any = getattr(self.source, "cut_short", ())
        return sample["__url__"] in cut

    def async_next(self) -> dict[str, Any]:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        while not self._ended:
            try:
                item = self.source.async_next()
            except StopIteration:
                self._ended = True
                break
            except NotAvailable:
                raise
            except Exception as error:
                if not self._next_shard_failed():
                    raise
                self._error = error  # the sample before it is whole: it comes first
                break
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
                raise TypeError(
                    f"WebDataset expects (path, data) items, got {type(item).__name__} "
                    f"{item!r:.80}; put it after load_from_tar()"
                )
            path, data = item
            shard, member = split_shard(path)
            parts = None if _META.match(member) else split_key(member)
            if parts is None:
                continue
            key, field = parts
            sample = self._sample
            if sample is not None and sample["__key__"] == key and sample["__url__"] == shard:
                if field in sample:
                    raise ValueError(
                        f"sample {key!r} of {shard!r} has two members with extension "
                        f"{field!r}; each field of a sample must be unique"
                    )
                sample[field] = data
                continue
            stamp = current_stamp()
            self._sample = {"__key__": key, "__url__": shard}
            local = _local_path(shard)
            if local is not None:
                self._sample["__local_path__"] = local
            self._sample[field] = data
            done, done_stamp, self._stamp = sample, self._stamp, stamp
            if done is not None and not (done["__url__"] != shard and self._cut_short(done)):
                restore_stamp(done_stamp)  # type: ignore[arg-type]
                return done
        sample, self._sample = self._sample, None
        if sample is not None and self._cut_short(sample):
            sample = None
        if sample is None:
            if self._error is not None:  # a later shard failed: after this one's end
                pending, self._error = self._error, None
                raise pending
            raise StopIteration
        if self._stamp is not None:
            restore_stamp(self._stamp)
        return sample

    def _next_shard_failed(self) -> bool:
        """Whether the read that failed was of a later input than the sample being grouped
        (a shard that cannot be opened or read): that sample is whole, as it is when a
        worker's task ends at its shard (groups never span two inputs)."""
        if self._sample is None or self._stamp is None:
            return False
        failed, grouped = key_position(current_stamp()[2]), key_position(self._stamp[2])
        return failed is not None and grouped is not None and failed != grouped

    def state_dict(self) -> dict[str, Any]:
        # A copy: the sample being grouped grows after the state is taken.
        sample = dict(self._sample) if self._sample is not None else None
        return {"sample": sample, "stamp": self._stamp, "ended": self._ended}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        sample, stamp, ended = (
            _field(state, "sample"),
            _field(state, "stamp"),
            _field(state, "ended"),
        )
        if sample is not None and not (
            isinstance(sample, dict)
            and isinstance(sample.get("__key__"), str)
            and isinstance(sample.get("__url__"), str)
            and all(isinstance(name, str) for name in sample)
        ):
            raise StateError(
                f"WebDataset: state field 'sample' must be None or a sample dict with str "
                f"'__key__' and '__url__', got {sample!r:.100}"
            )
        if stamp is not None:
            stamp = StateFields(self, state).stamp("stamp")
        if not isinstance(ended, bool):
            raise StateError(f"WebDataset: state field 'ended' must be a bool, got {ended!r:.100}")
        self._sample = dict(sample) if sample is not None else None
        self._stamp = stamp
        self._ended = ended

    def __repr__(self) -> str:
        return "WebDataset()"


def _field(state: Any, name: str) -> Any:
    if not isinstance(state, dict) or name not in state:
        raise StateError(
            f"WebDataset: the state must be a dict with the field {name!r}, got {state!r:.100}; "
            f"load a state saved from the same pipeline"
        )
    return state[name]
