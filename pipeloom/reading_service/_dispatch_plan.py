"""Cut a pipeline for the *economic* and *chunked* strategies.

Both strategies run the sharding root and everything upstream of it in the
main process, which hands each root output (its *position* and value) to a
worker chosen at that moment -- the least loaded one -- instead of
replicating the source in every worker:

* **economic** (seed 000): item workers run the per-item blocks between the
  root and the ``batch``; batch workers receive the items of a batch from any
  item worker, run ``batch`` and the per-item blocks after it (``collate``);
  the main process keeps at most ``prefetch_factor`` batches in flight in
  total, whatever ``num_workers`` is.
* **chunked** (seed 004): runs of ``chunk_size`` consecutive items go to one
  item worker; the main process reassembles them in order and runs ``batch``
  and everything after it.

A map-style source read through ``MapToIter`` is not read in the main
process: only its index crosses to the worker, which reads the item itself.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from .._validate import check_choice, check_int
from ..datapipes import Batcher, DataPipe, IterDataPipe
from ..graph import Placement, traverse
from ._plan import plan_workers

__all__ = ["STRATEGIES", "DispatchPlan", "check_strategy_args", "plan_dispatch"]

STRATEGIES = ("classic", "economic", "chunked")


@dataclass(frozen=True)
class DispatchPlan:
    """Where the main process, item workers and batch workers meet.

    Attributes:
        pipeline: the pipeline the plan is for.
        strategy: ``"economic"`` or ``"chunked"``.
        root: the sharding root (run in the main process with its upstream).
        item_exit: the last block item workers run.
        batcher: the ``batch`` block that follows ``item_exit``.
        batch_exit: the last block batch workers run (economic), else None.
        item_blocks: the blocks item workers run.
        batch_blocks: the blocks batch workers run (economic).
    """

    pipeline: IterDataPipe
    strategy: str
    root: IterDataPipe
    item_exit: IterDataPipe
    batcher: Batcher
    batch_exit: IterDataPipe | None
    item_blocks: tuple[DataPipe, ...]
    batch_blocks: tuple[DataPipe, ...]

    @property
    def batch_size(self) -> int:
        return self.batcher.batch_size

    @property
    def exit(self) -> IterDataPipe:
        """The block whose output the main process receives from workers."""
        return self.batch_exit if self.batch_exit is not None else self.item_exit

    def placement(self, item_label: str, batch_label: str) -> Placement:
        where = {id(b): item_label for b in self.item_blocks}
        where.update({id(b): batch_label for b in self.batch_blocks})
        return Placement(
            self.pipeline,
            tuple((b, where.get(id(b), "main process")) for b in traverse(self.pipeline).nodes),
        )


def plan_dispatch(pipeline: IterDataPipe, strategy: str) -> DispatchPlan:
    """Plan ``strategy`` (``"economic"`` or ``"chunked"``) for ``pipeline``.

    Raises:
        ValueError: no sharding point, no ``batch`` right after the per-item
            blocks, or (economic) a block between the sharding point and the
            batch that does not yield exactly one output per item.
    """
    base = plan_workers(pipeline, batches_in_workers=False)
    root = base.roots()[0]
    assert isinstance(root, IterDataPipe)
    graph = traverse(pipeline)
    item_exit = base.exit
    batcher = _following_batcher(graph, item_exit, strategy)
    upstream_of_root = {id(b) for b in traverse(root).nodes}
    item_blocks = tuple(b for b in base.worker_blocks if id(b) not in upstream_of_root)
    if strategy == "chunked":
        return DispatchPlan(pipeline, strategy, root, item_exit, batcher, None, item_blocks, ())
    _check_one_to_one(item_blocks)
    batch_blocks: list[DataPipe] = [batcher]
    batch_exit: IterDataPipe = batcher
    while batch_exit is not graph.output:
        after = graph.consumers(batch_exit)
        if len(after) != 1 or not after[0].per_item or len(after[0].parents) != 1:
            break
        batch_exit = after[0]  # type: ignore[assignment]  # per_item blocks are iterable
        batch_blocks.append(batch_exit)
    return DispatchPlan(
        pipeline, strategy, root, item_exit, batcher, batch_exit, item_blocks, tuple(batch_blocks)
    )


def _following_batcher(graph, item_exit: IterDataPipe, strategy: str) -> Batcher:
    consumers = [] if item_exit is graph.output else graph.consumers(item_exit)
    if len(consumers) == 1 and type(consumers[0]) is Batcher:
        return consumers[0]
    found = "the end of the pipeline" if not consumers else repr(consumers[0])
    raise ValueError(
        f"strategy={strategy!r} builds batches from items made by many workers, so it needs "
        f".batch(n) right after the per-item blocks; after {item_exit!r} comes {found}. "
        f"Add .batch(n) (and .collate()) after the per-item work, or use strategy='classic'"
    )


def _check_one_to_one(item_blocks: tuple[DataPipe, ...]) -> None:
    for block in item_blocks:
        if not block.one_to_one:
            raise ValueError(
                f"strategy='economic' assigns each item of a batch to a worker before it is "
                f"made, so every block between the sharding point and .batch() must yield "
                f"exactly one output per input, but {block!r} may not; move it before "
                f".sharding_filter() or after .batch(), or use strategy='chunked' or 'classic'"
            )


def check_strategy_args(
    strategy: Any, prefetch_factor: int, num_batch_workers: Any, chunk_size: Any, in_order: bool
) -> None:
    """Explain strategy arguments that cannot work (see ``MultiProcessingReadingService``)."""
    check_choice("strategy", strategy, STRATEGIES)
    _check_option("num_batch_workers", num_batch_workers, strategy, "economic")
    _check_option("chunk_size", chunk_size, strategy, "chunked")
    if num_batch_workers is not None and num_batch_workers > prefetch_factor:
        warnings.warn(
            f"num_batch_workers={num_batch_workers} > prefetch_factor={prefetch_factor}: "
            f"at most prefetch_factor batches are in flight, so the extra batch workers "
            f"stay idle; raise prefetch_factor or lower num_batch_workers",
            stacklevel=4,
        )
    if strategy != "classic" and not in_order:
        raise ValueError(
            f"in_order=False only applies to strategy='classic'; strategy={strategy!r} "
            f"delivers in order at no cost"
        )


def _check_option(name: str, value: Any, strategy: str, owner: str) -> None:
    if value is None:
        return
    if strategy != owner:
        raise ValueError(
            f"{name} only applies to strategy={owner!r}, got it with strategy={strategy!r}; "
            f"drop it or use strategy={owner!r}"
        )
    check_int(name, value, minimum=1)
