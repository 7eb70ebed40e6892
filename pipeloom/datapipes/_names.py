"""The file name a path or URL ends with, which blocks read a format or extension from.

A signed cloud URL (``https://host/x.tar.gz?sig=abc``) ends with its query, not
with ``.tar.gz``: the name is the last part of the URL's *path*. A local path
keeps ``?`` and ``#`` as characters of its file name, so only strings that look
like URLs (``scheme://...``) are parsed. A member of an archive read from such a
URL (``https://host/s.tar?sig=abc/x/0001.jpg``) is named by its own last part:
a :class:`~pipeloom.datapipes.TarMemberPath` says where its member starts, and
a query or fragment holding a ``/`` is taken as followed by members.

Example:
    >>> file_name("https://host/d/x.tar.gz?sig=abc#f"), file_name("data/what?.tar.gz")
    ('x.tar.gz', 'what?.tar.gz')
    >>> file_name("https://host/s.tar?sig=abc/x/0001.jpg")
    '0001.jpg'
"""

from __future__ import annotations

import posixpath
import re
import urllib.parse

__all__ = ["file_name", "is_url", "strip_query"]

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def file_name(path: str) -> str:
    """The last part of ``path``'s file path, without a URL's query and fragment."""
    member = getattr(path, "member", None)
    if isinstance(member, str):
        return posixpath.basename(member)
    return posixpath.basename(strip_query(path))


def is_url(path: str) -> bool:
    """Whether ``path`` looks like a URL (``scheme://...``), not a local path."""
    return _URL.match(path) is not None


def strip_query(path: str) -> str:
    """``path`` without the query and fragment of a URL (a local path is kept whole).

    A query or fragment holding a ``/`` is taken as followed by members of an
    archive (``s.tar?sig=a/x/0001.jpg``) and is kept.
    """
    if not is_url(path):
        return path
    parts = urllib.parse.urlsplit(path)
    if "/" in parts.query or "/" in parts.fragment:
        return path
    return urllib.parse.urlunsplit(parts._replace(query="", fragment=""))
