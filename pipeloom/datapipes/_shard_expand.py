"""``shard_expand``: brace patterns such as ``"ds-{000..099}.tar"`` into shard names."""

from __future__ import annotations

import re
from typing import Any

from ._expand import Expander

__all__ = ["ShardExpander", "expand_shards"]

_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")


def expand_shards(pattern: str) -> list[str]:
    """Expand every ``{low..high}`` range of ``pattern``, left to right.

    ``{00..12}`` (bounds of equal width, starting with 0) pads with zeros;
    ``{0..12}`` does not. Several ranges give every combination, the last
    range varying fastest.

    Raises:
        ValueError: a range with ``low >= high``, a zero-padded low bound
            shorter than the high one, or a low bound wider than the high one.

    Example:
        >>> expand_shards("a{1..3}-{00..01}")
        ['a1-00', 'a1-01', 'a2-00', 'a2-01', 'a3-00', 'a3-01']
    """
    found = _RANGE.search(pattern)
    if found is None:
        return [pattern]
    low_text, high_text = found.group(1), found.group(2)
    low, high = int(low_text), int(high_text)
    if len(low_text) > len(high_text):
        raise ValueError(
            f"shard_expand: in {pattern!r} the low bound {low_text!r} is wider than the high "
            f"bound {high_text!r}; write e.g. {{0..12}} or {{00..12}}"
        )
    padded = len(low_text) == len(high_text) and low_text.startswith("0")
    if not padded and low_text.startswith("0") and low_text != "0":
        raise ValueError(
            f"shard_expand: in {pattern!r} the zero-padded low bound {low_text!r} is shorter "
            f"than {high_text!r}; pad both to the same width, e.g. {{{low:0{len(high_text)}d}.."
            f"{high_text}}}"
        )
    if low >= high:
        raise ValueError(f"shard_expand: the range {found.group(0)} in {pattern!r} is empty")
    width = len(high_text) if padded else 0
    prefix, rests = pattern[: found.start()], expand_shards(pattern[found.end() :])
    return [
        f"{prefix}{number:0{width}d}{rest}" for number in range(low, high + 1) for rest in rests
    ]


class ShardExpander(Expander):
    """Expand each brace pattern into its shard names (functional: ``shard_expand``).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> list(IterableWrapper(["ds-{00..02}.tar"]).shard_expand())
        ['ds-00.tar', 'ds-01.tar', 'ds-02.tar']
    """

    def _expand(self, item: Any) -> list[str]:
        if not isinstance(item, str):
            raise TypeError(
                f"shard_expand() expects str patterns such as 'ds-{{000..099}}.tar', got "
                f"{type(item).__name__} {item!r}"
            )
        return expand_shards(item)

    def __repr__(self) -> str:
        return "ShardExpander()"
