"""The planner: one frozen, printable :class:`~pipeloom.graph.Plan` per loader.

Every reading service asks :func:`make_plan` once, at ``initialize``, and runs
what the plan says; ``DataLoader.placement()`` returns the plan. The decisions
come from the blocks' declared traits (``per_item``, ``one_to_one``,
``batches_of()``, ``is_shardable()``, ``is_separate_process()``, ...; see
``cut.py``), never from their types:

* the *parts*: the main part, the workers' part (replicated by every worker
  under threads/classic; item and batch workers under economic/chunked), and
  one part per block marked to run in a separate process;
* the *sharding point* and how positions are dealt out;
* the *unit* the main process hands out (economic: batches; chunked: chunks)
  and how many are in flight;
* the *queues* between the parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...datapipes import DataPipe, IterDataPipe
from ...graph import Part, Plan, QueueLink, traverse, upstream
from .cut import PlanError, cut_for_dispatch, cut_for_workers, refuse_restarting_the_workers

__all__ = ["LINK_CAPACITY", "Settings", "make_plan", "outer_group_size"]

LINK_CAPACITY = 4
"""Items in flight on one item worker -> batch worker queue (economic).

The link's producer keeps freed segments for reuse (a fresh segment costs a
page fault per 4 KiB, ~120 ms per 128 MiB, more than the copy itself); what it
keeps is bounded by the items in flight, which the main process bounds by
``prefetch_factor``.
"""
_OUTPUTS = "(position, draws, item)"
# Strategies whose workers replicate the part up to the sharding point:
# strategy -> (main location, workers' location, what carries their outputs).
_REPLICAS = {
    "threads": ("main thread", "worker threads", "ThreadQueue"),
    "classic": ("main process", "worker processes", "ProcessQueue"),
    "ray": ("main process", "ray actors", "ObjectRefGenerator"),
}


@dataclass(frozen=True)
class Settings:
    """What a service asks of the planner.

    Attributes:
        strategy: ``"in-process"``, ``"threads"``, ``"classic"``, ``"ray"``,
            ``"economic"`` or ``"chunked"``.
        workers: worker threads or (item) worker processes.
        batch_workers: batch worker processes (economic); 0: each item worker
            builds whole batches (per-item blocks, ``batch`` and what follows).
        prefetch: outputs per worker (threads, classic), batches in flight
            (economic, chunked), outputs of a separate process.
        chunk_size: items per chunk (chunked); None spreads a batch over the
            workers, or over ``cores`` when fewer.
        cores: the cores the workers may run on (None: as many as the workers).
        outer: ``(total, index)``: this process's share (e.g. a rank's).
    """

    strategy: str
    workers: int = 0
    batch_workers: int = 0
    prefetch: int = 2
    chunk_size: int | None = None
    outer: tuple[int, int] = (1, 0)
    cores: int | None = None


def make_plan(pipeline: IterDataPipe, settings: Settings) -> Plan:
    """Plan ``pipeline`` as ``settings`` ask.

    Raises:
        ValueError: when the pipeline cannot run that way, saying why and what
            to change (no sharding point, a filter before an economic batch, a
            separate process inside the workers' part, ...).
    """
    if settings.strategy == "in-process":
        return _plan_in_process(pipeline, settings)
    if settings.strategy in _REPLICAS:
        return _plan_replicas(pipeline, settings)
    return _plan_dispatch(pipeline, settings)


def outer_group_size(pipeline: IterDataPipe) -> int:
    """How a process's outer share (a rank's) is cut: as the classic strategy cuts it.

    So a rank keeps the same items whatever its service and strategy.
    """
    return cut_for_workers(pipeline, refuse_separate=False).group_size


def _plan_in_process(pipeline: IterDataPipe, settings: Settings) -> Plan:
    nodes = traverse(pipeline).nodes
    main = Part("main", "main thread", nodes)
    if settings.outer == (1, 0):
        return Plan.from_parts(pipeline, (main,), strategy="in-process")
    # Cut as the worker services do (runs of batch_size positions when they would
    # build batches in workers), so a rank's items do not depend on its service.
    cut = cut_for_workers(pipeline, refuse_separate=False)  # the marks are ignored here
    return Plan.from_parts(
        pipeline,
        (main,),
        strategy="in-process",
        sharding_point=cut.sharding_point,
        group_size=cut.group_size,
        outer=settings.outer,
        notes=(_outer_note(settings.outer),),
    )


def _plan_replicas(pipeline: IterDataPipe, settings: Settings) -> Plan:
    """Threads, classic and Ray: every worker replicates the part up to the sharding point."""
    main_location, workers_kind, queue_kind = _REPLICAS[settings.strategy]
    workers_location = f"{workers_kind} x{settings.workers}"
    # Classic processes build batches also when the per-item blocks drop or multiply
    # items (assembled: the workers pass the batch boundaries round; classic/assemble.py).
    assemble = settings.strategy == "classic" and settings.outer == (1, 0)
    cut = cut_for_workers(pipeline, assemble=assemble)
    refuse_restarting_the_workers(pipeline, cut.exit)
    workers = Part("workers", workers_location, cut.worker_blocks, cut.exit, settings.workers)
    separate = _separate_parts(pipeline, (workers,), settings)
    main = _main_part(pipeline, main_location, (workers, *separate))
    queues = [
        QueueLink(
            workers_location,
            main_location,
            queue_kind,
            settings.workers,
            settings.prefetch,
            "whole batches, a marker per run" if cut.assembled else _OUTPUTS,
        ),
        *_separate_queues(separate, main_location, settings),
    ]
    if cut.assembled:
        dealt = (
            f"runs of {cut.group_size} position{'s' if cut.group_size > 1 else ''} go to "
            f"one worker, which builds the batches its run completes and passes the items "
            f"that do not fill one on to the next run's worker"
        )
    elif cut.group_size == 1:
        dealt = "positions go to the workers one at a time"
    else:
        dealt = f"runs of {cut.group_size} positions go to one worker, which builds whole batches"
    merged = (
        "the main process reads them run after run"
        if cut.assembled
        else "their outputs are merged back in position order"
    )
    notes = [f"{dealt}; {merged}"]
    if settings.outer != (1, 0):
        notes.append(_outer_note(settings.outer))
    return Plan.from_parts(
        pipeline,
        (main, workers, *separate),
        strategy=settings.strategy,
        sharding_point=cut.sharding_point,
        group_size=cut.group_size,
        queues=tuple(queues),
        outer=settings.outer,
        notes=tuple(notes),
    )


def _plan_dispatch(pipeline: IterDataPipe, settings: Settings) -> Plan:
    """Economic and chunked: the main process reads the sharding point and hands out work."""
    strategy = settings.strategy
    cut = cut_for_dispatch(pipeline, strategy)
    refuse_restarting_the_workers(pipeline, cut.item_exit)
    batch_size = cut.batch_size
    n = settings.workers
    item_location = f"item worker processes x{n}"
    item = Part("item workers", item_location, cut.item_blocks, cut.item_exit, n)
    parts: tuple[Part, ...] = (item,)
    # Chunked whose per-item blocks are one to one: item workers build whole batches too,
    # but the first batch of an epoch goes out in chunks (it comes sooner).
    whole_batches = cut.batch_exit is not None and (
        strategy == "chunked" or settings.batch_workers == 0
    )
    first_unit_chunk = None
    spread = n if settings.cores is None else max(1, min(n, settings.cores))
    if whole_batches and cut.relayed:  # chunks, each worker building the batches they complete
        assert cut.batch_exit is not None
        blocks = (*cut.item_blocks, *cut.batch_blocks)
        parts = (Part("item workers", item_location, blocks, cut.batch_exit, n),)
        expands = not all(b.one_to_one or b.at_most_one for b in cut.item_blocks)
        chunk_size = _chunk_size(settings.chunk_size, batch_size, spread, expands)
        unit = ("chunk", chunk_size, max(1, math.ceil(settings.prefetch * batch_size / chunk_size)))
        max_tasks = unit[2] + 1  # the epoch's final chunk
    elif whole_batches:  # an item worker's task is a batch, which it builds and collates
        assert cut.batch_exit is not None
        blocks = (*cut.item_blocks, *cut.batch_blocks)
        parts = (Part("item workers", item_location, blocks, cut.batch_exit, n),)
        unit = ("batch", batch_size, settings.prefetch)
        max_tasks = unit[2]
        if strategy == "chunked":
            chunk_size = _chunk_size(settings.chunk_size, batch_size, spread, False)
            if chunk_size < batch_size:
                first_unit_chunk = chunk_size
                max_tasks += math.ceil(batch_size / chunk_size)  # the first batch's chunks
    elif strategy == "chunked":
        # the per-item blocks may drop or multiply items (else whole batches, above)
        chunk_size = _chunk_size(settings.chunk_size, batch_size, spread, True)
        unit = ("chunk", chunk_size, max(1, math.ceil(settings.prefetch * batch_size / chunk_size)))
        max_tasks = unit[2]
    else:
        unit = ("batch", batch_size, settings.prefetch)
        max_tasks = unit[2] * batch_size
        batch_location = f"batch workers x{settings.batch_workers}"
        batch = Part(
            "batch workers",
            batch_location,
            cut.batch_blocks,
            cut.batch_exit,
            settings.batch_workers,
        )
        parts = (item, batch)
    separate = _separate_parts(pipeline, parts, settings)
    main = _main_part(pipeline, "main process", (*parts, *separate))
    queues = [QueueLink("main process", item_location, "ProcessQueue", n, max_tasks + 2, "tasks")]
    if strategy == "chunked" or whole_batches:
        carried = "batches" if whole_batches else "chunks"
        queues.append(
            QueueLink(item_location, "main process", "ProcessQueue", n, max_tasks + 2, carried)
        )
        if cut.relayed and whole_batches:
            queues.append(
                QueueLink(
                    item_location,
                    item_location,
                    "ProcessQueue",
                    n * n,
                    LINK_CAPACITY,
                    "relayed items that do not fill a batch",
                )
            )
    else:
        m = settings.batch_workers
        queues += [
            QueueLink("main process", batch_location, "ProcessQueue", m, max_tasks + 2, "sizes"),
            QueueLink(item_location, batch_location, "ProcessQueue", n * m, LINK_CAPACITY, "items"),
            QueueLink(batch_location, "main process", "ProcessQueue", m, unit[2] + 2, "batches"),
        ]
    queues += _separate_queues(separate, "main process", settings)
    name, size, in_flight = unit
    if whole_batches and cut.relayed:
        handed = (
            "chunk to the least loaded item worker, which builds and collates the batches "
            "the chunk completes and passes the items that do not fill one on to the next "
            "chunk's worker; the main process reads the batches chunk after chunk"
        )
    elif whole_batches:
        handed = "batch to the least loaded item worker, which builds and collates it"
        if first_unit_chunk is not None:
            handed += (
                f" (the first batch of an epoch: each chunk of {first_unit_chunk} items to "
                f"the least loaded item worker, and the main process batches them)"
            )
    elif strategy == "economic":
        handed = "item to the least loaded item worker; each batch to the least loaded batch worker"
    else:
        handed = "chunk to the least loaded item worker"
    notes = [f"the main process reads the sharding point and gives each {handed}"]
    if settings.outer != (1, 0):
        notes.append(_outer_note(settings.outer))
    return Plan.from_parts(
        pipeline,
        (main, *parts, *separate),
        strategy=strategy,
        sharding_point=cut.sharding_point,
        group_size=outer_group_size(pipeline) if settings.outer != (1, 0) else 1,
        unit=(name, size, in_flight),
        first_unit_chunk=first_unit_chunk,
        queues=tuple(queues),
        outer=settings.outer,
        notes=tuple(notes),
    )


def _chunk_size(asked: int | None, batch_size: int, workers: int, expands: bool) -> int:
    """Items of the sharding point per chunk: by default a batch spread over ``workers``.

    ``workers`` is the item workers, or the cores when fewer: more chunks than
    can run at once make the first batch no sooner, and each costs a message.

    When the per-item part may make several outputs of one input (a tar shard
    read into its samples), one input per chunk, so shards spread over the
    workers instead of a batch's worth of shards landing on one.
    """
    if asked is None:
        return 1 if expands else max(1, math.ceil(batch_size / workers))
    if asked > batch_size:
        raise PlanError(
            f"chunk_size must be at most the batch size ({batch_size}), got "
            f"{asked}; a chunk is a part of one batch. Use chunk_size <= "
            f"{batch_size}, or leave it None to spread each batch over the workers"
        )
    return asked


def _separate_parts(
    pipeline: IterDataPipe, worker_parts: tuple[Part, ...], settings: Settings
) -> tuple[Part, ...]:
    """One part per block marked ``is_separate_process()`` outside the workers' parts."""
    in_workers = {id(b) for part in worker_parts for b in part.blocks}
    exits = [part.exit for part in worker_parts if part.exit is not None]
    nodes = traverse(pipeline).nodes
    marked = [b for b in nodes if id(b) not in in_workers and b.is_separate_process()]
    for block in marked:
        if not isinstance(block, IterDataPipe):
            raise TypeError(f"only iterable blocks can run in a separate process, got {block!r}")
        if any(b is e for b in upstream(block) for e in exits):
            raise PlanError(
                f"{block!r} asks for a separate process, but it reads the workers' output, "
                f"which only the main process can receive. Drop the mark, or mark a block on a "
                f"branch that the workers neither run nor feed (e.g. a side stream zipped with "
                f"their output)"
            )
    seen_by_main = _reachable_without(pipeline, {id(b) for b in marked} | in_workers)
    parts = []
    for number, block in enumerate(marked, 1):
        location = "separate process" if len(marked) == 1 else f"separate process {number}"
        own = tuple(b for b in upstream(block) if id(b) not in seen_by_main | in_workers)
        _refuse_a_shared_stream(pipeline, block, own)
        parts.append(Part("separate process", location, own, block))
    return tuple(parts)


def _refuse_a_shared_stream(pipeline: IterDataPipe, marked: DataPipe, own: tuple) -> None:
    """Raise when an iterable block upstream of ``marked`` is also read outside its process.

    The separate process runs a copy of everything upstream of ``marked``: a
    ``fork`` or ``demux`` whose other child is read elsewhere would run twice,
    each copy buffering the items its unread child never takes.
    """
    graph = traverse(pipeline)
    inside = {id(b) for b in own}
    for block in upstream(marked)[1:]:
        if not isinstance(block, IterDataPipe):
            continue  # read by index: each process may keep its own copy
        readers = graph.consumers(block)
        outside = [r for r in readers if id(r) not in inside]
        if not outside or len(outside) == len(readers):
            continue  # read only in the process, or only outside it
        raise PlanError(
            f"{marked!r} asks for a separate process, but {block!r} upstream of it is also "
            f"read outside that process (by {outside[0]!r}): the process runs its own copy of "
            f"everything upstream of {marked!r}, so that stream would be read twice and a "
            f"fork's or demux's buffer would fill with the items its other child takes "
            f"elsewhere. Mark a block that reads every child (e.g. the zip of the fork's "
            f"children), or fork after the marked block"
        )


def _separate_queues(
    separate: tuple[Part, ...], main_location: str, settings: Settings
) -> list[QueueLink]:
    return [
        QueueLink(
            part.location, main_location, "ProcessQueue", 1, settings.prefetch, "(stamp, item)"
        )
        for part in separate
    ]


def _main_part(pipeline: IterDataPipe, location: str, others: tuple[Part, ...]) -> Part:
    elsewhere = {id(b) for part in others for b in part.blocks}
    return Part(
        "main", location, tuple(b for b in traverse(pipeline).nodes if id(b) not in elsewhere)
    )


def _reachable_without(output: DataPipe, stop: set[int]) -> set[int]:
    """Ids of the blocks reached from ``output`` without passing through ``stop``."""
    seen: set[int] = set()
    stack = [output]
    while stack:
        block = stack.pop()
        if id(block) in seen or id(block) in stop:
            continue
        seen.add(id(block))
        stack.extend(block.parents)
    return seen


def _outer_note(outer: tuple[int, int]) -> str:
    return f"this process keeps shard {outer[1]} of {outer[0]} of the positions"
