"""Whole-pipeline operations: restart, seed, set the epoch, checkpoint, check inputs.

The pipeline is walked through each block's ``parents`` only (``pipeloom._walk``);
per-block framework state is changed through the block base's methods.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

from .._validate import check_int
from .._walk import not_a_block, walk_upstream
from ..errors import StateError
from ._attributes import attribute_values
from ._base import DataPipe, IterDataPipe
from ._context import derive_seed
from ._generator_place import check_generator_place
from ._numbering import overrides
from ._output_stamps import OutputStamps

__all__ = [
    "check_declared_inputs",
    "is_sharding_root",
    "refuse_hidden_inputs",
    "refuse_shared_streams",
    "load_pipeline_state_dict",
    "pipeline_state_dict",
    "reset_pipeline",
    "seed_pipeline",
    "set_pipeline_epoch",
    "set_pipeline_round",
    "set_input_round",
    "start_iteration",
    "upstream_blocks",
]


def upstream_blocks(output: DataPipe) -> list[DataPipe]:
    """Every block ``output`` depends on, itself first, each before its parents.

    Shared blocks (e.g. behind ``fork``) appear once; the order depends only
    on the pipeline's structure (``pipeloom.graph.traverse`` is the public view).

    Raises:
        TypeError: if ``output`` is not a block.
        ValueError: if the blocks form a cycle.
    """
    if not isinstance(output, DataPipe):
        raise not_a_block(output)
    return walk_upstream(output)


def refuse_hidden_inputs(blocks: Sequence[DataPipe]) -> None:
    """Raise if a block declares ``inputs`` but keeps another block outside them.

    The walk follows the declared inputs only: the hidden block would not be
    restarted with the pipeline (a second epoch would read it exhausted), nor
    seeded, sharded or placed.
    """
    for block in blocks:
        if not block.declares_inputs():
            continue  # every block-valued attribute is an input already
        declared = {id(p) for p in block.parents}
        hidden = [
            value
            for value in attribute_values(block)
            if isinstance(value, DataPipe) and id(value) not in declared
        ]
        if hidden:
            value = hidden[0]
            name = next(n for n, v in vars(block).items() if v is value)  # raising: may be slow
            kind = type(block).__name__
            raise TypeError(
                f"{kind} keeps the block {type(value).__name__} in attribute {name!r} but "
                f"its inputs = {block.inputs!r} leave it out; add {name!r} to {kind}.inputs, "
                f"or remove the inputs declaration to have every block-valued attribute "
                f"taken as an input"
            )


def refuse_shardable_without_settings(blocks: Sequence[DataPipe]) -> None:
    """Raise if a block says it is shardable but cannot keep only its shard.

    A reading service calls ``sharding_settings(total, index)`` on each
    worker's copy of the sharding point; the default does nothing, so every
    worker would read every item and the epoch would hold each one once per
    worker.
    """
    for block in blocks:
        if block.is_shardable() and not overrides(type(block), "sharding_settings", DataPipe):
            kind = type(block).__name__
            raise TypeError(
                f"{kind}.is_shardable() returns True but {kind} does not implement "
                f"sharding_settings(total, index), so each worker would read every item "
                f"(the epoch would hold each item once per worker); implement "
                f"sharding_settings to keep only shard index of total (e.g. the items i with "
                f"i % total == index), or return False from is_shardable() and put "
                f".sharding_filter() after the block"
            )


def start_iteration(output: DataPipe) -> None:
    """What a top-level ``iter(block)`` does first: check the inputs, restart every block."""
    blocks = walk_upstream(output)
    refuse_hidden_inputs(blocks)
    refuse_shardable_without_settings(blocks)
    refuse_shared_streams(blocks)
    refuse_restarting_shared_blocks(blocks)
    for block in blocks:
        block._restart()


def reset_pipeline(output: DataPipe) -> None:
    """Start a new iteration of every block ``output`` depends on (consumers first)."""
    for block in upstream_blocks(output):
        block._restart()


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
    check_int("seed", seed, allow_none=True)
    for index, block in enumerate(upstream_blocks(output)):
        block._assign_seed(index, seed)


def set_pipeline_epoch(output: DataPipe, epoch: int) -> None:
    """Tell every block the epoch; random blocks then draw a new, reproducible order."""
    check_int("epoch", epoch, minimum=0)
    for block in upstream_blocks(output):
        block._enter_epoch(epoch)


def replay_pipeline_epoch(output: DataPipe, epoch: tuple[int, int], seeds: Sequence[Any]) -> None:
    """Restart every block ``output`` depends on as it ran in ``epoch`` (an epoch and a
    round), with the epoch seeds it drew then (:func:`drawn_epoch_seeds`), so a random
    block upstream gives that epoch's order again (used by ``in_memory_cache``)."""
    blocks = upstream_blocks(output)
    for block in blocks:
        block._enter_epoch(epoch[0])
        block._enter_round(epoch[1])
    for index, block in enumerate(blocks):
        block._restart(seeds[index] if index < len(seeds) else None)


def drawn_epoch_seeds(output: DataPipe) -> list[int | None]:
    """The epoch seed each block ``output`` depends on has drawn so far (None: not yet)."""
    return [block._drawn_epoch_seed() for block in upstream_blocks(output)]


def set_pipeline_round(output: DataPipe, round_number: int) -> None:
    """Start repetition ``round_number`` of the stream within the epoch (used by ``cycle``).

    Each round draws new seeds, so a shuffle upstream reshuffles and
    ``item_rng()`` gives new values, reproducibly.
    """
    for block in upstream_blocks(output):
        block._enter_round(round_number)


def set_input_round(block: DataPipe, source: DataPipe, local: int) -> None:
    """Start repetition ``local`` of ``source``, an input that ``block`` repeats.

    ``block`` may itself be in a later round of a repetition further down (a cycle
    inside a cycle): its input's round then combines both, so every outer round
    draws new seeds too instead of replaying the first one's.
    """
    own = block._round_number()
    set_pipeline_round(source, derive_seed(own, local) if own else local)


def check_declared_inputs(output: DataPipe) -> None:
    """Fail early on blocks the graph cannot see or chain: ``DataLoader`` calls it.

    A block that declares ``inputs`` but keeps another block in an undeclared
    attribute would hide it from restarting, seeding, sharding and placement
    (``iter()`` refuses it too); an attribute named like a chaining method
    (``self.batch = 4``) would hide ``.batch()``.
    """
    from ._functional import IterFunctional, MapFunctional

    chaining = sorted(  # dir(): the mixins' methods too
        name for name in {*dir(IterFunctional), *dir(MapFunctional)} if not name.startswith("_")
    )
    blocks = upstream_blocks(output)
    for block in blocks:
        shadowing = _shadowed(block, chaining)
        if shadowing:
            raise TypeError(
                f"{type(block).__name__} sets the attribute {shadowing[0]!r}, which hides the "
                f"chaining method .{shadowing[0]}(); rename the attribute (e.g. "
                f"'{shadowing[0]}_size' or '_{shadowing[0]}')"
            )
    refuse_hidden_inputs(blocks)
    refuse_shardable_without_settings(blocks)
    refuse_shared_streams(blocks)
    refuse_restarting_shared_blocks(blocks)


def refuse_shared_streams(blocks: Sequence[DataPipe]) -> None:
    """Raise if an iterable block is read by several blocks (``a.zip(a)``).

    An iterable block gives each item once: two readers would each take some
    of its items and miss the others, silently. ``fork`` and ``demux`` are
    made for several readers (the class attribute ``read_by_several``, which
    ``on_disk_cache`` sets too: its end block consults it); anything else is
    split with them. Map-style blocks are read by index and may be shared.
    """
    readers: dict[int, list[DataPipe]] = {}
    for block in blocks:
        for parent in block.parents:
            readers.setdefault(id(parent), []).append(block)
    for block in blocks:
        found = readers.get(id(block), ())
        if len(found) < 2 or not isinstance(block, IterDataPipe):
            continue
        if getattr(type(block), "read_by_several", False):
            continue
        raise ValueError(
            f"{block!r} is read {len(found)} times (by {found[0]!r} and by {found[1]!r}), but "
            f"an iterable block gives each item once: each reader would get only some of "
            f"its items (so would the parts of a random_split() over one source). Give each "
            f"reader its own copy of the stream: .fork({len(found)}) it and read one child "
            f"in each place (or split it with .demux()). A block of your own that several "
            f"blocks are meant to read sets the class attribute read_by_several = True"
        )


def refuse_restarting_shared_blocks(blocks: Sequence[DataPipe]) -> None:
    """Raise if a block restarts an input whose upstream another branch also reads.

    ``cycle`` and ``mux(stop="cycle")`` restart an exhausted input and every block
    upstream of it. When one of those (a ``fork`` or ``demux`` parent) also feeds a
    branch outside that input, the restart would make that branch read its items
    again, or lose its place.
    """
    restarting = [block for block in blocks if block.restarts_inputs]
    if not restarting:
        return
    readers: dict[int, list[DataPipe]] = {}
    for block in blocks:
        for parent in block.parents:
            readers.setdefault(id(parent), []).append(block)
    for block in restarting:
        for source in block.parents:
            inside = walk_upstream(source)
            allowed = {id(b) for b in inside} | {id(block)}
            for shared in inside:
                outside = [r for r in readers.get(id(shared), ()) if id(r) not in allowed]
                if outside:
                    reason = getattr(block, "restart_reason", "when it runs out")
                    raise ValueError(
                        f"{block!r} restarts {source!r} ({reason}), and with it "
                        f"{shared!r}, which is also read by {outside[0]!r} outside that "
                        f"input (e.g. the other child of a fork or demux): that branch "
                        f"would read its items again or lose them. Repeat the stream "
                        f"before splitting it (e.g. .cycle(n).fork(2)), or use "
                        f"mux(stop='all')"
                    )


def _shadowed(block: DataPipe, names: list[str]) -> list[str]:
    """Which ``names`` (chaining methods) an instance attribute of ``block`` hides.

    Asked through ``getattr`` rather than ``vars(block)``, which would slow the
    block down for good (see ``_attributes.py``).
    """
    cls = type(block)
    found = []
    for name in names:
        value = getattr(block, name, _MISSING)
        if value is _MISSING:
            continue
        method = getattr(cls, name, _MISSING)
        if method is _MISSING or getattr(value, "__func__", value) is not method:
            found.append(name)
    return found


_MISSING = object()
STATE_VERSION = 1


def pipeline_state_dict(output: DataPipe) -> dict:
    """The mid-epoch state of every block, keyed by its place in the graph.

    Raises:
        StateError: naming the block that cannot save its state.
    """
    blocks = upstream_blocks(output)
    states = []
    for index, block in enumerate(blocks):
        try:
            state = block.state_dict()
        except NotImplementedError as error:
            raise StateError(f"block #{index} {block!r}: {error}") from error
        check_generator_place(index, block, state)
        if state and not type(block).__module__.startswith("pipeloom."):
            _check_picklable(index, block, state)  # pipeloom's own blocks save plain values
        entry: dict[str, Any] = {"type": type(block).__qualname__, "state": state}
        numbering = block._numbering()  # a user-defined source's count (stamps_positions)
        if numbering.active:
            entry["numbered"] = numbering.count
        elif numbering.active is None and (numbering.count or numbering.skip_before):
            # resumed, and no output yet: the count it resumed from (a replaying block's
            # is in the positions it skips), or the next resume would number from 0
            total, index = numbering.shard
            entry["numbered"] = numbering.count or (numbering.skip_before - index) // total
        elif numbering.outputs is not None and numbering.outputs.input_stamp is not None:
            entry["outputs"] = numbering.outputs.state()  # its last input (_output_stamps.py)
        states.append(entry)
    return {"version": STATE_VERSION, "blocks": states}


def _check_picklable(index: int, block: DataPipe, state: Any) -> None:
    """Refuse a user block's state that ``torch.save`` could not write, naming its field."""
    try:
        pickle.dumps(state)
    except Exception as error:
        fields = state.items() if isinstance(state, dict) else ()
        bad = [name for name, value in fields if not _pickles(value)]
        where = f"its field {bad[0]!r}" if bad else "it"
        raise StateError(
            f"block #{index} {block!r}: state_dict() returned a state that cannot be pickled "
            f"({type(error).__name__}: {error}), so torch.save could not write the checkpoint; "
            f"{where} must hold plain values (ints, strings, lists, dicts, tensors): save what "
            f"rebuilds the live object (a path, an offset) and rebuild it in load_state_dict()"
        ) from error


def _pickles(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


def load_pipeline_state_dict(output: DataPipe, state: dict) -> None:
    """Restore :func:`pipeline_state_dict` into a pipeline of the same shape.

    Raises:
        StateError: if the state is from another version or pipeline shape.
    """
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
        numbered = entry.get("numbered")
        if numbered is not None:
            count = check_int("numbered", numbered, minimum=0)
            block._restore_numbering(count, replays=entry["state"] in ({}, None))
        if entry.get("outputs") is not None:
            block._numbering().outputs = OutputStamps()
            block._numbering().outputs.load(entry["outputs"])  # type: ignore[union-attr]
        try:
            block.load_state_dict(entry["state"])
        except StateError as error:
            raise StateError(f"block #{index}: {error}") from error
        except Exception as error:  # a block that does not check its fields
            raise StateError(
                f"block #{index} {block!r} could not load its state ({type(error).__name__}: "
                f"{error}); the state is damaged or was saved from another pipeline"
            ) from error


def is_sharding_root(block: DataPipe) -> bool:
    """True when no block upstream of ``block`` is shardable.

    Only the root of a path splits work and stamps item positions; a shardable
    block below it (e.g. ``open_files`` after ``sharding_filter``) passes the
    root's positions through; so does one below a block that stands in for
    the sharding point (an economic/chunked item worker's feed).
    """
    return not any(
        parent.is_shardable() or getattr(parent, "stands_in_for_sharding_point", False)
        for parent in upstream_blocks(block)[1:]
    )
