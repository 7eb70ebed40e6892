"""Whole-pipeline operations used by the loader and by ``iter()``.

The pipeline is walked through each block's declared ``parents`` only.
"""

from __future__ import annotations

from ._base import DataPipe

__all__ = [
    "check_declared_inputs",
    "reset_pipeline",
    "seed_pipeline",
    "set_pipeline_epoch",
    "set_pipeline_round",
    "upstream_blocks",
]


def upstream_blocks(output: DataPipe) -> list[DataPipe]:
    """Every block ``output`` depends on, itself first, each before its parents.

    Shared blocks (e.g. behind ``fork``) appear once. The order is
    deterministic: it depends only on the pipeline's structure.

    Raises:
        ValueError: if the blocks form a cycle.
    """
    if not isinstance(output, DataPipe):
        raise TypeError(
            f"expected a pipeline (an IterDataPipe or MapDataPipe), got "
            f"{type(output).__name__}; wrap plain iterables with IterableWrapper(...)"
        )
    postorder: list[DataPipe] = []
    state: dict[int, int] = {}  # id -> 1 visiting, 2 done
    stack: list[tuple[DataPipe, int]] = [(output, 0)]
    path: list[DataPipe] = []
    while stack:
        block, next_parent = stack.pop()
        if next_parent == 0:
            if state.get(id(block)) == 2:
                continue
            state[id(block)] = 1
            path.append(block)
        parents = block.parents
        if next_parent < len(parents):
            stack.append((block, next_parent + 1))
            parent = parents[next_parent]
            mark = state.get(id(parent))
            if mark == 1:
                cycle = path[path.index(parent) :] + [parent]
                raise ValueError(
                    "the pipeline has a cycle: "
                    + " -> ".join(type(b).__name__ for b in reversed(cycle))
                    + "; a pipeline must be a DAG (use fork() to feed a block's output "
                    "to several consumers)"
                )
            if mark is None:
                stack.append((parent, 0))
        else:
            state[id(block)] = 2
            path.pop()
            postorder.append(block)
    postorder.reverse()
    return postorder


def reset_pipeline(output: DataPipe) -> None:
    """Start a new iteration of every block ``output`` depends on (consumers first)."""
    for block in upstream_blocks(output):
        block._pl_reset()


def seed_pipeline(output: DataPipe, seed: int | None) -> None:
    """Give every block a seed derived from ``seed`` and its place in the graph.

    Blocks constructed with their own ``seed=`` keep it. ``None`` removes the
    pipeline seed (randomness then follows torch's default generator).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> dp = IterableWrapper(range(10)).shuffle()
        >>> seed_pipeline(dp, 1); first = list(dp)
        >>> seed_pipeline(dp, 1); first == list(dp)
        True
    """
    from ._context import derive_seed

    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__} {seed!r}")
    for index, block in enumerate(upstream_blocks(output)):
        # The key is the block's place in the pipeline first seeded, so a copy of
        # a sub-graph (a worker's part) re-seeded later gets the same seeds.
        if block._pl_seed_key is None:
            block._pl_seed_key = index
        if not block._pl_seed_fixed:
            block._pl_seed = None if seed is None else derive_seed(seed, block._pl_seed_key)
        block._pl_epoch_seed = None


def set_pipeline_epoch(output: DataPipe, epoch: int) -> None:
    """Tell every block the epoch; random blocks then draw a new, reproducible order."""
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
    for block in upstream_blocks(output):
        block._pl_epoch = epoch
        block._pl_round = 0
        block._pl_epoch_seed = None
        block.set_epoch(epoch)


def set_pipeline_round(output: DataPipe, round_number: int) -> None:
    """Start repetition ``round_number`` of the stream within the epoch (used by ``cycle``).

    Each round draws new seeds, so a shuffle upstream reshuffles and
    ``item_rng()`` gives new values, reproducibly.
    """
    for block in upstream_blocks(output):
        block._pl_round = round_number
        block._pl_epoch_seed = None


def check_declared_inputs(output: DataPipe) -> None:
    """Fail early when a block holds an upstream block it did not declare in ``inputs``.

    The graph is walked through ``inputs`` only; an undeclared input would be
    invisible to seeding, sharding and placement.
    """
    from ._functional import IterFunctional, MapFunctional

    chaining = set(dir(IterFunctional)) | set(dir(MapFunctional))  # mixins' methods too
    for block in upstream_blocks(output):
        shadowing = sorted(
            name for name in vars(block) if name in chaining and not name.startswith("_")
        )
        if shadowing:
            raise TypeError(
                f"{type(block).__name__} sets the attribute {shadowing[0]!r}, which hides the "
                f"chaining method .{shadowing[0]}(); rename the attribute (e.g. "
                f"'{shadowing[0]}_size' or '_{shadowing[0]}')"
            )
        declared = {id(p) for p in block.parents}
        for name, value in vars(block).items():
            if isinstance(value, DataPipe) and id(value) not in declared:
                raise TypeError(
                    f"{type(block).__name__} keeps the block {type(value).__name__} in "
                    f"attribute {name!r} but does not declare it as an input; add "
                    f"inputs = ({name!r},) to class {type(block).__name__}"
                )


STATE_VERSION = 1


def pipeline_state_dict(output: DataPipe) -> dict:
    """The mid-epoch state of every block, keyed by its place in the graph.

    Raises:
        StateError: naming the block that cannot save its state.
    """
    from ..errors import StateError

    blocks = upstream_blocks(output)
    states = []
    for index, block in enumerate(blocks):
        try:
            state = block.state_dict()
        except NotImplementedError as error:
            raise StateError(f"block #{index} {block!r}: {error}") from error
        states.append({"type": type(block).__qualname__, "state": state})
    return {"version": STATE_VERSION, "blocks": states}


def load_pipeline_state_dict(output: DataPipe, state: dict) -> None:
    """Restore :func:`pipeline_state_dict` into a pipeline of the same shape.

    Raises:
        StateError: if the state is from another version or pipeline shape.
    """
    from ..errors import StateError

    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise StateError(
            f"expected a pipeline state of version {STATE_VERSION}, got "
            f"{state.get('version') if isinstance(state, dict) else type(state).__name__!r}"
        )
    blocks = upstream_blocks(output)
    saved = state.get("blocks")
    if not isinstance(saved, (list, tuple)) or not all(
        isinstance(entry, dict) and isinstance(entry.get("type"), str) and "state" in entry
        for entry in saved
    ):
        raise StateError(
            "the pipeline state's 'blocks' must be a list of {'type': str, 'state': ...} "
            "entries (what pipeline_state_dict() returns); the state is damaged"
        )
    if len(saved) != len(blocks):
        raise StateError(
            f"the state has {len(saved)} blocks but the pipeline has {len(blocks)}; "
            f"load it into the same pipeline it was saved from"
        )
    for index, (block, entry) in enumerate(zip(blocks, saved)):
        if entry["type"] != type(block).__qualname__:
            raise StateError(
                f"block #{index} is {type(block).__qualname__} ({block!r}) but the state "
                f"was saved from a {entry['type']}; the pipeline shape differs"
            )
    for index, (block, entry) in enumerate(zip(blocks, saved)):
        try:
            block.load_state_dict(entry["state"])
        except StateError as error:
            raise StateError(f"block #{index}: {error}") from error
        except Exception as error:  # a block that does not check its fields
            raise StateError(
                f"block #{index} {block!r} could not load its state ({type(error).__name__}: "
                f"{error}); the state is damaged or was saved from another pipeline"
            ) from error


def traverse_roots(output: DataPipe, indices: tuple[int, ...]) -> list[DataPipe]:
    """The blocks at ``indices`` of :func:`upstream_blocks` (stable across copies)."""
    blocks = upstream_blocks(output)
    return [blocks[i] for i in indices]


def is_sharding_root(block: DataPipe) -> bool:
    """True when no block upstream of ``block`` is shardable.

    Only the root of a path splits work and stamps item positions; a shardable
    block below it (e.g. ``open_files`` after ``sharding_filter``) passes the
    root's positions through.
    """
    return not any(parent.is_shardable() for parent in upstream_blocks(block)[1:])
