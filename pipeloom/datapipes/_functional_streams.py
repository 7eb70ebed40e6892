"""Chaining methods that reshape items and streams (a mixin of ``IterFunctional``).

Column selection, repetition, lengths, indexing, key joins, grouping,
splitting and synchronisation, with torchdata 0.9's names and arguments.
Each method builds the block it names with ``self`` as its input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._base import IterDataPipe

__all__ = ["StreamFunctional"]


class StreamFunctional:
    """Item and stream reshaping methods of every ``IterDataPipe``."""

    # -- lengths ---------------------------------------------------------------------
    def set_length(self, length: int) -> IterDataPipe:
        """Pass items through; ``len()`` returns ``length``. See :class:`LengthSetter`."""
        from ._set_length import LengthSetter

        return LengthSetter(self, length)

    # -- columns ---------------------------------------------------------------------
    def rows2columnar(self, column_names: Sequence[str] | None = None) -> IterDataPipe:
        """Turn each batch of rows into a dict of columns. See :class:`Rows2Columnar`."""
        from ._rows2columnar import Rows2Columnar

        return Rows2Columnar(self, column_names)
