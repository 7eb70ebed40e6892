"""Cut a pipeline into the part replicated in workers and the part after the merge.

The rule (DESIGN.md): the *sharding roots* are shardable blocks with no
shardable block upstream. Workers run a copy of everything up to the roots
(deterministic, so every copy agrees), the roots keep only their shard, and
the per-item blocks that follow (``per_item = True``: map, filter, decode...,
and shardable blocks below the root) run in the workers too. The first block
that needs the whole ordered stream (shuffle, batch, zip...) and everything
after it run in the main process, fed by a merge of the workers' outputs in
source-position order.

Under the *classic* strategy a ``batch`` (and the per-item blocks after it,
such as ``collate``) also runs in the workers when every block between the
root and the batch yields exactly one output per input: each worker then
receives runs of ``batch_size`` consecutive positions, so its batches are the
in-process batches.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from ..datapipes import Batcher, DataPipe, IterDataPipe, ShardingFilter
from ..datapipes.runtime import block_seed, derive_seed
from ..graph import Placement, traverse

__all__ = ["WorkerPlan", "plan_workers", "root_epoch_seed"]


@dataclass(frozen=True)
class WorkerPlan:
    """Where the workers' part of a pipeline ends.

    Attributes:
        pipeline: the pipeline the plan is for.
        exit: the last block run in workers; its output is merged.
        exit_index: ``exit``'s index in ``traverse(pipeline).nodes``.
        root_indices: the sharding roots, as indices into ``traverse(exit).nodes``.
        group_size: consecutive source positions that go to the same worker.
        worker_blocks: every block that runs in the workers.
        single_output: each group of ``group_size`` positions yields at most one
            output, so the merge moves on as soon as it delivered one (instead of
            waiting for the owner's next message to learn the group is done).
    """

    pipeline: IterDataPipe
    exit: IterDataPipe
    exit_index: int
    root_indices: tuple[int, ...]
    group_size: int
    worker_blocks: tuple[DataPipe, ...]
    single_output: bool = False

    def roots(self, exit_copy: DataPipe | None = None) -> list[DataPipe]:
        """The sharding roots in ``exit_copy`` (a copy of ``exit``; default: ``exit``)."""
        nodes = traverse(self.exit if exit_copy is None else exit_copy).nodes
        return [nodes[i] for i in self.root_indices]

    def placement(self, worker_label: str, main_label: str = "main process") -> Placement:
        """Which blocks run in the workers and which after the merge."""
        in_workers = {id(b) for b in self.worker_blocks}
        return Placement(
            self.pipeline,
            tuple(
                (b, worker_label if id(b) in in_workers else main_label)
                for b in traverse(self.pipeline).nodes
            ),
        )


def plan_workers(
    pipeline: IterDataPipe, *, batches_in_workers: bool = True, refuse_separate: bool = True
) -> WorkerPlan:
    """Find the worker part of ``pipeline`` (see the module docstring).

    ``refuse_separate=False`` lets blocks marked ``is_separate_process()`` be in
    the worker part: for a caller that runs everything in one thread anyway.

    Raises:
        ValueError: no sharding point, several sharding points on separate
            branches, a worker part with several exits, or (``refuse_separate``)
            a block marked ``is_separate_process()`` in the worker part.
    """
    graph = traverse(pipeline)
    nodes = graph.nodes
    roots = _sharding_roots(pipeline)
    in_workers = {id(b) for b in traverse(roots[0]).nodes}  # the root and its upstream
    for block in reversed(nodes):  # sources first, so parents are decided before consumers
        runs_on_a_shard = block.per_item or block.is_shardable()
        if runs_on_a_shard and block.parents and all(id(p) in in_workers for p in block.parents):
            in_workers.add(id(block))
    marked = [n for n in nodes if id(n) in in_workers and n.is_separate_process()]
    if marked and refuse_separate:
        raise ValueError(
            f"{marked[0]!r} asks for a separate process, but it is in the part of the pipeline "
            f"that every worker replicates; a separate process can only serve one consumer. "
            f"Drop the mark, or mark a block on a branch that the workers neither run nor "
            f"feed (e.g. a side stream zipped with their output)"
        )
    exit_block = _single_exit(graph, in_workers)
    group_size = 1
    if batches_in_workers:
        exit_block, group_size = _extend_over_batch(graph, exit_block, roots, in_workers)
    return WorkerPlan(
        pipeline=pipeline,
        exit=exit_block,
        exit_index=graph.index(exit_block),
        root_indices=tuple(_index_in(traverse(exit_block).nodes, root) for root in roots),
        group_size=group_size,
        worker_blocks=tuple(n for n in nodes if id(n) in in_workers),
        single_output=_single_output(exit_block, roots[0], group_size),
    )


def _single_output(exit_block: IterDataPipe, root: DataPipe, group_size: int) -> bool:
    """At most one output per group of positions (see ``WorkerPlan.single_output``)."""
    chain = traverse(exit_block).nodes
    below_root = chain[: _index_in(chain, root)]
    if group_size > 1:  # a Batcher builds one batch per group; what follows it counts
        batchers = [i for i, b in enumerate(below_root) if type(b) is Batcher]
        below_root = below_root[: batchers[-1]] if batchers else below_root
    return all(b.one_to_one or b.at_most_one for b in below_root)


def _sharding_roots(pipeline: IterDataPipe) -> list[DataPipe]:
    nodes = traverse(pipeline).nodes
    shardable = [n for n in nodes if n.is_shardable()]
    roots = []
    for block in shardable:
        upstream = traverse(block).nodes[1:]
        shadowing = [u for u in upstream if u.is_shardable()]
        if shadowing and isinstance(block, ShardingFilter):  # a redundant explicit one
            warnings.warn(
                f"{block!r} is downstream of another sharding point ({shadowing[0]!r}); "
                f"only the upstream one splits the data, {block!r} passes every item "
                f"through. Remove one of them to silence this warning",
                stacklevel=4,
            )
        elif not shadowing:
            roots.append(block)
    if not roots:
        raise ValueError(
            "the pipeline has no sharding point, so every worker would produce every "
            "item; add .sharding_filter() where the stream can be split (after any "
            "shuffle of the file list, before the expensive per-item work)"
        )
    if len(roots) > 1:
        raise ValueError(
            f"the pipeline has {len(roots)} independent sharding points "
            f"({', '.join(repr(r) for r in roots)}); an ordered merge needs exactly one. "
            f"Merge the branches first (e.g. concat/zip), then add one .sharding_filter()"
        )
    return roots


def _single_exit(graph, in_workers: set[int]) -> IterDataPipe:
    exits: list[IterDataPipe] = []
    for parent_index, consumer_index in graph.edges:
        parent, consumer = graph.nodes[parent_index], graph.nodes[consumer_index]
        if id(parent) in in_workers and id(consumer) not in in_workers:
            if all(e is not parent for e in exits):
                exits.append(parent)
    if id(graph.output) in in_workers:
        exits.append(graph.output)
    if len(exits) != 1:
        raise ValueError(
            f"the part of the pipeline that runs in workers must feed the rest through "
            f"one block, but it has {len(exits)} exits: {', '.join(repr(e) for e in exits)}"
            f"; move the fork/zip after the per-item blocks or before the sharding point"
        )
    return exits[0]


def _extend_over_batch(graph, exit_block, roots, in_workers: set[int]):
    consumers = graph.consumers(exit_block) if exit_block is not graph.output else []
    if len(consumers) != 1 or type(consumers[0]) is not Batcher:
        return exit_block, 1
    batcher = consumers[0]
    chain = traverse(exit_block).nodes
    root = roots[0]
    between = chain[: _index_in(chain, root)]
    if not all(b.one_to_one for b in between) or not hasattr(root, "set_shard_group_size"):
        return exit_block, 1
    in_workers.add(id(batcher))
    new_exit = batcher
    while True:
        after = graph.consumers(new_exit) if new_exit is not graph.output else []
        if len(after) == 1 and after[0].per_item and len(after[0].parents) == 1:
            new_exit = after[0]
            in_workers.add(id(new_exit))
        else:
            return new_exit, batcher.batch_size


def _index_in(nodes, block) -> int:
    for i, node in enumerate(nodes):
        if node is block:
            return i
    raise ValueError(f"{block!r} not found")


def root_epoch_seed(plan: WorkerPlan, epoch: int) -> int | None:
    """The seed the sharding root stamps on its items in ``epoch`` (as in-process)."""
    seed = block_seed(plan.roots()[0])
    return None if seed is None else derive_seed(seed, epoch)
