"""Where a pipeline is cut between workers and the main process, from the blocks' traits.

The rule (DESIGN.md): the *sharding point* is the shardable block with no
shardable block upstream of it (``sharding_filter``, a file opener, a
map-style source read by index). Workers run a copy of everything up to it
(deterministic, so every copy agrees), the sharding point keeps only its
shard, and the blocks that follow and work on one item at a time
(``per_item = True``: map, filter, decode..., and shardable blocks below the
sharding point) run in the workers too. The first block that needs the whole
ordered stream (shuffle, batch, zip...) and everything after it run in the
main process.

When the per-item blocks map one input to one output, the block after them
combines runs of consecutive inputs (``batches_of()``: a ``batch``), and the
sharding point can deal out runs of positions (``can_shard_in_groups()``),
that block and the per-item blocks after it (``collate``) run in the workers
too: each worker then receives runs of ``batch_size`` consecutive positions,
so its batches are the in-process batches (:func:`cut_for_workers`).

The economic and chunked strategies keep the sharding point in the main
process and cut after the per-item blocks instead (:func:`cut_for_dispatch`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from ...datapipes import DataPipe, IterDataPipe, MapBatcher, MapToIter, ShardingFilter
from ...datapipes.runtime import HoldsItems
from ...errors import PlanError
from ...graph import Graph, traverse, upstream

__all__ = [
    "DispatchCut",
    "PlanError",
    "WorkerCut",
    "assembles_batches",
    "cut_for_dispatch",
    "cut_for_workers",
    "find_sharding_point",
    "one_per_input_below_point",
    "single_output",
]


@dataclass(frozen=True)
class WorkerCut:
    """The part of a pipeline every worker replicates.

    Attributes:
        sharding_point: where each worker keeps its shard.
        exit: the last block run in workers; its output is merged.
        worker_blocks: every block that runs in the workers (graph order).
        group_size: consecutive source positions that go to the same worker.
        single_output: each group of ``group_size`` positions yields at most one
            output, so the merge moves on as soon as it delivered one (instead of
            waiting for the owner's next message to learn the group is done).
        assembled: the workers build batches although the blocks before ``batch``
            may drop or multiply items (``strategies/classic/assemble.py``).
    """

    sharding_point: DataPipe
    exit: IterDataPipe
    worker_blocks: tuple[DataPipe, ...]
    group_size: int
    single_output: bool
    assembled: bool = False


@dataclass(frozen=True)
class DispatchCut:
    """Where the main process, item workers and batch workers meet (economic, chunked).

    Attributes:
        sharding_point: read in the main process, with everything upstream.
        item_exit: the last block item workers run.
        batcher: the block that combines items into batches, after ``item_exit``.
        batch_exit: the last block of ``batch`` and the per-item blocks after it
            (``collate``), which batch workers run (economic) or item workers
            run on whole batches; None for chunked when the per-item blocks may
            drop or multiply items and the sharding point may give one position
            several items (the main process then builds the batches).
        item_blocks: the blocks item workers run.
        batch_blocks: ``batcher`` to ``batch_exit`` (empty when that is None).
        relayed: chunked whose per-item blocks may drop or multiply items: item
            workers build the batches their chunks complete, relaying the items
            that do not fill one (``strategies/dispatch/relay.py``).
    """

    sharding_point: IterDataPipe
    item_exit: IterDataPipe
    batcher: IterDataPipe
    batch_exit: IterDataPipe | None
    item_blocks: tuple[DataPipe, ...]
    batch_blocks: tuple[DataPipe, ...]
    relayed: bool = False

    @property
    def batch_size(self) -> int:
        size = self.batcher.batches_of()
        assert size is not None  # found by its trait
        return size


def find_sharding_point(pipeline: DataPipe) -> DataPipe:
    """The one shardable block with no shardable block upstream.

    Raises:
        ValueError: no sharding point, or several on separate branches.
    """
    points = []
    for block in traverse(pipeline).nodes:
        if not block.is_shardable():
            continue
        shadowing = [u for u in upstream(block)[1:] if u.is_shardable()]
        if shadowing and isinstance(block, ShardingFilter):  # a redundant explicit one
            warnings.warn(
                f"{block!r} is downstream of another sharding point ({shadowing[0]!r}); "
                f"only the upstream one splits the data, {block!r} passes every item "
                f"through. Remove one of them to silence this warning",
                stacklevel=5,
            )
        elif not shadowing:
            points.append(block)
    if not points:
        raise PlanError(
            "the pipeline has no sharding point, so every worker would produce every "
            "item; add .sharding_filter() where the stream can be split (after any "
            "shuffle of the file list, before the expensive per-item work)"
        )
    if len(points) > 1:
        raise PlanError(
            f"the pipeline has {len(points)} independent sharding points "
            f"({', '.join(repr(r) for r in points)}); an ordered merge needs exactly one. "
            f"Merge the branches first (e.g. concat/zip), then add one .sharding_filter()"
        )
    return points[0]


def cut_for_workers(
    pipeline: IterDataPipe,
    *,
    batches_in_workers: bool = True,
    refuse_separate: bool = True,
    assemble: bool = False,
) -> WorkerCut:
    """The part of ``pipeline`` that workers replicate (see the module docstring).

    ``assemble=True`` moves ``batch`` (and ``collate``) into the workers also
    when the per-item blocks are not one to one: the workers then find the
    batch boundaries together (``strategies/classic/assemble.py``).
    ``refuse_separate=False`` lets blocks marked ``is_separate_process()`` be in
    the worker part: for a caller that runs everything in one thread anyway.

    Raises:
        ValueError: no sharding point, several sharding points on separate
            branches, a worker part with several exits, or (``refuse_separate``)
            a block marked ``is_separate_process()`` in the worker part.
    """
    graph = traverse(pipeline)
    nodes = graph.nodes
    point = find_sharding_point(pipeline)
    replicated = {id(b) for b in upstream(point)}  # the sharding point and its upstream
    in_workers = set(replicated)
    for block in reversed(nodes):  # sources first, so parents are decided before consumers
        runs_on_a_shard = block.per_item or block.is_shardable()
        if runs_on_a_shard and block.parents and all(id(p) in in_workers for p in block.parents):
            if _groups_items_of_several_positions(block, replicated):
                continue
            in_workers.add(id(block))
    marked = [n for n in nodes if id(n) in in_workers and n.is_separate_process()]
    if marked and refuse_separate:
        raise PlanError(
            f"{marked[0]!r} asks for a separate process, but it is in the part of the pipeline "
            f"that every worker replicates; a separate process can only serve one consumer. "
            f"Drop the mark, or mark a block on a branch that the workers neither run nor "
            f"feed (e.g. a side stream zipped with their output)"
        )
    exit_block = _single_exit(graph, in_workers)
    group_size = 1
    assembled = False
    if batches_in_workers:
        item_exit = exit_block
        exit_block, group_size = _extend_over_batch(graph, exit_block, point, in_workers)
        # Not extended (a .batch(1) extends with runs of 1 position: its consumer, e.g.
        # another .batch(), then needs the merged stream, not a worker's positions).
        if assemble and exit_block is item_exit:
            exit_block, group_size = _assemble_over_batch(graph, exit_block, point, in_workers)
            assembled = group_size > 0
            group_size = max(group_size, 1)
    return WorkerCut(
        sharding_point=point,
        exit=exit_block,
        worker_blocks=tuple(n for n in nodes if id(n) in in_workers),
        group_size=group_size,
        single_output=single_output(exit_block, point, group_size),
        assembled=assembled,
    )


def _groups_items_of_several_positions(block: DataPipe, replicated: set[int]) -> bool:
    """True for a block that groups consecutive items (``groups_expanded_items``: the
    members of a tar shard into a ``webdataset`` sample) with no block below the sharding
    point that made them of one input: the members of one sample may then have several
    positions, dealt to several workers, so the grouping must see the merged stream."""
    if not getattr(type(block), "groups_expanded_items", False):
        return False
    below = [b for b in upstream(block)[1:] if id(b) not in replicated]
    return all(b.one_to_one or b.at_most_one for b in below)


def assembles_batches(exit_block: DataPipe, point: DataPipe) -> bool:
    """True when workers whose part ends at ``exit_block`` build batches of items that
    the blocks after ``point`` may drop or multiply (an assembled cut)."""
    chain = upstream(exit_block)
    below_point = chain[: _index_in(chain, point)]
    batchers = [i for i, b in enumerate(below_point) if b.batches_of() is not None]
    if not batchers:
        return False
    return not all(b.one_to_one for b in below_point[batchers[-1] + 1 :])


def refuse_restarting_the_workers(pipeline: IterDataPipe, exit_block: DataPipe) -> None:
    """Raise when a block that restarts its input within an epoch (``cycle``) reads the
    workers' output: the workers' part would have to run again mid-epoch."""
    for block in traverse(pipeline).nodes:
        if getattr(block, "restarts_its_input", False) and any(
            b is exit_block for b in upstream(block)[1:]
        ):
            raise PlanError(
                f"{block!r} restarts its input within an epoch, but its input is fed by the "
                f"workers, which produce each epoch once; move it before the sharding point "
                f"(e.g. .cycle(n).sharding_filter(): the workers then share the repeated "
                f"stream), or read this pipeline in-process (num_workers=0)"
            )


def cut_for_dispatch(pipeline: IterDataPipe, strategy: str) -> DispatchCut:
    """Cut ``pipeline`` for ``strategy`` (``"economic"`` or ``"chunked"``).

    Raises:
        ValueError: no sharding point, no batch right after the per-item
            blocks, or (economic) a block between the sharding point and the
            batch that does not yield exactly one output per item.
    """
    base = cut_for_workers(pipeline, batches_in_workers=False)
    point = base.sharding_point
    assert isinstance(point, IterDataPipe)
    graph = traverse(pipeline)
    item_exit = base.exit
    batcher = _following_batcher(graph, item_exit, strategy)
    upstream_of_point = {id(b) for b in upstream(point)}
    item_blocks = tuple(b for b in base.worker_blocks if id(b) not in upstream_of_point)
    relayed = strategy == "chunked" and not all(map(one_per_input_below_point, item_blocks))
    if relayed and point.stamps_positions and not (point.one_to_one or point.at_most_one):
        return DispatchCut(point, item_exit, batcher, None, item_blocks, ())  # a position's
        # several items could fall in two chunks: the main process builds the batches
    if strategy == "economic":
        _check_one_to_one(item_blocks)
    batch_blocks: list[DataPipe] = [batcher]
    batch_exit: IterDataPipe = batcher
    for block in _per_item_chain_after(graph, batcher):
        if relayed and not block.one_to_one:  # a batch's resume point is its one output's
            break
        batch_exit = block  # type: ignore[assignment]  # per_item blocks are iterable
        batch_blocks.append(block)
    return DispatchCut(
        point, item_exit, batcher, batch_exit, item_blocks, tuple(batch_blocks), relayed
    )


def one_per_input_below_point(block: DataPipe) -> bool:
    """True when ``block``, run below the sharding point, yields one output per input.

    A shardable block there (``open_files`` after ``sharding_filter``) keeps every
    item, as its sharding settings are left at "all": one stream per path.
    """
    return block.one_to_one or (block.is_shardable() and block.at_most_one)


def single_output(exit_block: DataPipe, point: DataPipe, group_size: int) -> bool:
    """At most one output per group of positions (see ``WorkerCut.single_output``)."""
    if point.stamps_positions and not (point.one_to_one or point.at_most_one):
        return False  # a custom sharding point may give one position several outputs
    chain = upstream(exit_block)
    below_point = chain[: _index_in(chain, point)]
    if group_size > 1:  # a batching block builds one output per group; what follows it counts
        batchers = [i for i, b in enumerate(below_point) if b.batches_of() is not None]
        below_point = below_point[: batchers[-1]] if batchers else below_point
    return all(b.one_to_one or b.at_most_one for b in below_point)


def _single_exit(graph: Graph, in_workers: set[int]) -> IterDataPipe:
    exits: list[DataPipe] = []
    for parent_index, consumer_index in graph.edges:
        parent, consumer = graph.nodes[parent_index], graph.nodes[consumer_index]
        if id(parent) in in_workers and id(consumer) not in in_workers:
            if all(e is not parent for e in exits):
                exits.append(parent)
    if id(graph.output) in in_workers:
        exits.append(graph.output)
    if len(exits) != 1:
        raise PlanError(
            f"the part of the pipeline that runs in workers must feed the rest through "
            f"one block, but it has {len(exits)} exits: {', '.join(repr(e) for e in exits)}"
            f"; move the fork/zip after the per-item blocks or before the sharding point"
        )
    assert isinstance(exits[0], IterDataPipe)
    return exits[0]


def _extend_over_batch(
    graph: Graph, exit_block: IterDataPipe, point: DataPipe, in_workers: set[int]
) -> tuple[IterDataPipe, int]:
    consumers = graph.consumers(exit_block) if exit_block is not graph.output else []
    if len(consumers) != 1 or consumers[0].batches_of() is None:
        return exit_block, 1
    batcher = consumers[0]
    chain = upstream(exit_block)
    between = chain[: _index_in(chain, point)]
    if not all(b.one_to_one for b in between) or not point.can_shard_in_groups():
        return exit_block, 1
    in_workers.add(id(batcher))
    new_exit = batcher
    for block in _per_item_chain_after(graph, batcher):
        new_exit = block
        in_workers.add(id(block))
    assert isinstance(new_exit, IterDataPipe)
    return new_exit, batcher.batches_of()  # type: ignore[return-value]


def _assemble_over_batch(
    graph: Graph, exit_block: IterDataPipe, point: DataPipe, in_workers: set[int]
) -> tuple[IterDataPipe, int]:
    """Like ``_extend_over_batch`` for per-item blocks that are not one to one; the run
    size: a batch of positions when each yields at most one output, else 1 (a tar
    shard's samples fill batches of their own). 0 when not extended."""
    consumers = graph.consumers(exit_block) if exit_block is not graph.output else []
    if len(consumers) != 1 or consumers[0].batches_of() is None:
        return exit_block, 0
    if not point.can_shard_in_groups() or point.stamps_positions:
        return exit_block, 0  # a sharding point that gives a position several outputs
    batcher = consumers[0]
    chain = upstream(exit_block)
    between = chain[: _index_in(chain, point)]
    in_workers.add(id(batcher))
    new_exit = batcher
    for block in _per_item_chain_after(graph, batcher):
        # A worker builds exactly one output per batch, feeding the chain one batch at a
        # time: a block that reads ahead (threadpool_map) would find the feed's end after
        # the first batch and end the worker's output there, so it runs after the merge.
        if not block.one_to_one or isinstance(block, HoldsItems):
            break
        new_exit = block
        in_workers.add(id(block))
    assert isinstance(new_exit, IterDataPipe)
    if all(b.one_to_one or b.at_most_one for b in between):
        return new_exit, batcher.batches_of()  # type: ignore[return-value]
    return new_exit, 1


def _per_item_chain_after(graph: Graph, block: DataPipe) -> list[DataPipe]:
    """The per-item blocks that follow ``block`` one after another (e.g. ``collate``)."""
    chain = []
    while block is not graph.output:
        after = graph.consumers(block)
        if len(after) != 1 or not after[0].per_item or len(after[0].parents) != 1:
            break
        block = after[0]
        chain.append(block)
    return chain


def _following_batcher(graph: Graph, item_exit: IterDataPipe, strategy: str) -> IterDataPipe:
    consumers = [] if item_exit is graph.output else graph.consumers(item_exit)
    if len(consumers) == 1 and consumers[0].batches_of() is not None:
        batcher = consumers[0]
        assert isinstance(batcher, IterDataPipe)
        return batcher
    found = "the end of the pipeline" if not consumers else repr(consumers[0])
    hint = ""
    if consumers and getattr(type(consumers[0]), "groups_expanded_items", False):
        hint = (
            f" ({found} cannot run in the workers here: the sharding point deals out the "
            f"members it groups one by one, so shard the tar files instead, with "
            f".sharding_filter() before .load_from_tar())"
        )
    if isinstance(item_exit, MapToIter) and isinstance(item_exit.source, MapBatcher):
        hint = (
            " (the .batch(n) there was called on a map-style block, so each worker reads "
            "whole batches by index; batch the iterable instead: "
            "MapToIter(dataset.map(fn)).batch(n), or dataset.shuffle().map(fn).batch(n))"
        )
    raise PlanError(
        f"strategy={strategy!r} builds batches from items made by many workers, so it needs "
        f".batch(n) right after the per-item blocks; after {item_exit!r} comes {found}"
        f"{hint}. Add .batch(n) (and .collate()) after the per-item work, or use "
        f"strategy='classic'"
    )


def _check_one_to_one(item_blocks: tuple[DataPipe, ...]) -> None:
    for block in item_blocks:
        if not one_per_input_below_point(block):
            raise PlanError(
                f"strategy='economic' assigns each item of a batch to a worker before it is "
                f"made, so every block between the sharding point and .batch() must yield "
                f"exactly one output per input, but {block!r} may not. Use "
                f"strategy='chunked' or 'classic', which run such blocks (tar readers, "
                f"webdataset, flatmap, filter) in their workers and build whole batches "
                f"there; or move a filter before the sharding point, where the main process "
                f"runs it"
            )


def _index_in(nodes: list[DataPipe], block: DataPipe) -> int:
    for i, node in enumerate(nodes):
        if node is block:
            return i
    raise ValueError(f"{block!r} not found")
