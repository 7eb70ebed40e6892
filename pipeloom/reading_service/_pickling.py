"""Send a pipeline to a spawned process, or say which block cannot travel."""

from __future__ import annotations

import io
import pickle
from typing import Any

import cloudpickle

from ..datapipes import DataPipe
from ..graph import upstream as upstream_blocks

__all__ = ["dumps_pipeline", "loads_pipeline"]


def dumps_pipeline(pipe: DataPipe) -> bytes:
    """Pickle ``pipe`` (cloudpickle, so lambdas and local functions travel).

    Raises:
        TypeError: naming the first block that cannot be pickled, and why.
    """
    try:
        return cloudpickle.dumps(pipe)
    except Exception as error:  # noqa: BLE001 - find the culprit, then explain
        culprit, reason = _find_unpicklable(pipe, error)
        raise TypeError(
            f"the pipeline cannot be sent to worker processes started with spawn/forkserver: "
            f"{culprit} cannot be pickled ({reason}). Define its functions and classes at "
            f"module level, drop unpicklable attributes in __getstate__ (open them in "
            f"lazy_init instead), or use start_method='fork' or ThreadReadingService"
        ) from error


def loads_pipeline(payload: bytes) -> Any:
    return pickle.loads(payload)


class _OneBlockPickler(cloudpickle.Pickler):
    """Pickles one block, standing in a placeholder for every other block."""

    def __init__(self, file: io.BytesIO, block: DataPipe) -> None:
        super().__init__(file)
        self._block = block

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, DataPipe) and obj is not self._block:
            return id(obj)
        return None


def _find_unpicklable(pipe: DataPipe, error: Exception) -> tuple[str, str]:
    for block in reversed(upstream_blocks(pipe)):
        try:
            _OneBlockPickler(io.BytesIO(), block).dump(block)
        except Exception as block_error:  # noqa: BLE001
            return f"block {block!r}", f"{type(block_error).__name__}: {block_error}"
    return "the pipeline", f"{type(error).__name__}: {error}"
