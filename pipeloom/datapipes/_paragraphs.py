"""``lines_to_paragraphs``: join consecutive non-empty lines of a file."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._base import IterDataPipe
from ._context import current_stamp, restore_stamp
from ._map import check_callable, fn_name

__all__ = ["ParagraphAggregator"]


def join_lines(lines: list[str]) -> str:
    """The default joiner: the lines separated by ``"\\n"``."""
    return "\n".join(lines)


class ParagraphAggregator(IterDataPipe):
    """Yield ``(path, joiner(lines))`` for each paragraph (functional: ``lines_to_paragraphs``).

    The input is ``(path, line)`` items, e.g. from ``readlines()``. A paragraph
    is a run of non-empty lines of one file; an empty line or a new path ends
    it. Each paragraph carries the stamp of its first line.

    Args:
        source: a block yielding ``(path, line)``.
        joiner: turns a paragraph's list of lines into one value.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> lines = IterableWrapper([("a", "x"), ("a", "y"), ("a", ""), ("a", "z"), ("b", "w")])
        >>> list(lines.lines_to_paragraphs())
        [('a', 'x\\ny'), ('a', 'z'), ('b', 'w')]
    """

    inputs = ("source",)

    def __init__(
        self, source: IterDataPipe, joiner: Callable[[list[Any]], Any] = join_lines
    ) -> None:
        check_callable(joiner, "joiner", "lines_to_paragraphs", 1)
        self.source = source
        self.joiner = joiner
        self.reset()

    def reset(self) -> None:
        self._path: Any = None
        self._lines: list[Any] = []
        self._stamp: tuple = (None, 0, None, 0)
        self._ended = False

    def async_next(self) -> tuple[Any, Any]:
        while not self._ended:
            try:
                item = self.source.async_next()  # NotAvailable keeps the paragraph
            except StopIteration:
                self._ended = True
                break
            path, line = _split(item)
            stamp = current_stamp()
            if line and (path == self._path or not self._lines):
                if not self._lines:
                    self._stamp = stamp
                self._path = path
                self._lines.append(line)
                continue
            paragraph = self._take()
            if line:
                self._path, self._lines, self._stamp = path, [line], stamp
            else:
                self._path = path
            if paragraph is not None:
                return paragraph
        paragraph = self._take()
        if paragraph is None:
            raise StopIteration
        return paragraph

    def _take(self) -> tuple[Any, Any] | None:
        if not self._lines:
            return None
        lines, self._lines = self._lines, []
        stamp = self._stamp
        restore_stamp(stamp)
        return self._path, self.joiner(lines)

    def state_dict(self) -> dict[str, Any]:
        return {
            "path": self._path,
            "lines": list(self._lines),
            "stamp": self._stamp,
            "ended": self._ended,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._path = state["path"]
        self._lines = list(state["lines"])
        self._stamp = tuple(state["stamp"])
        self._ended = bool(state["ended"])

    def __repr__(self) -> str:
        return f"ParagraphAggregator(joiner={fn_name(self.joiner)})"


def _split(item: Any) -> tuple[Any, Any]:
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
        raise TypeError(
            f"lines_to_paragraphs() expects (path, line) items, got {type(item).__name__} "
            f"{item!r:.60}; read the files with readlines() (return_path=True, the default)"
        )
    return item[0], item[1]
