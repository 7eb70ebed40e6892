"""The compat loader's checkpoint: its layout, the checks on load, and its fingerprint.

A state (version 2)::

    {"version": 2, "kind": "map" | "iterable",
     "epoch": None | {"entries": ..., "base_seed": int, "delivered": int,
                      "first": int, "first_index": int, "plan_epoch": int,
                      "skip": [int, ...],   # optional: batches delivered out of order
                      "workers": int,       # an IterableDataset's: its worker count,
                      "outputs": [int, ...]},  # and its outputs delivered per worker
     "workers_base_seed": None | int,
     "generators": [ByteTensor, ...],      # generator / samplers' generators
     "global_rng": None | ByteTensor,       # torch's global RNG (see below)
     "python_rngs": None | {"random": ..., "numpy": {...}},
     "fingerprint": {"dataset": str, "sampler": str, ...}}

torch's global RNG is saved when the sampler draws from it (``generator`` is
None) or ``__getitem__`` runs in this process (``num_workers=0``), where
``random``'s and NumPy's global RNGs are saved too (``python_rngs``): loading
the state restores them, so augmentations drawn from them resume exactly.

``epoch`` is None between epochs. Version 1 states (no fingerprint) still load.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from .._fingerprint import describe, field_differences
from ..datapipes import StateFields
from ..errors import StateError
from ._plan import Entries, EpochPlan, PlanEntries
from ._range_entries import RangeEntries
from ._sampling import EpochRecipe

__all__ = [
    "STATE_VERSION",
    "CompatState",
    "loader_fingerprint",
    "python_rngs",
    "read_state",
    "sampler_generators",
]

STATE_VERSION = 2
_UNCHECKED_VERSION = 1
_OWNER = "compat DataLoader state"


@dataclass(frozen=True)
class CompatState:
    """A checked state, ready to apply."""

    epoch: dict[str, Any] | None  # the interrupted epoch: its plan, and batches delivered
    workers_base_seed: int | None
    epochs: int  # epochs the loader began
    generators: list[torch.Tensor]
    global_rng: torch.Tensor | None
    python_rngs: dict[str, Any] | None

    def restore_rngs(self) -> None:
        """Set torch's (and, when saved, ``random``'s and NumPy's) global RNGs."""
        if self.global_rng is not None:
            torch.set_rng_state(self.global_rng)
        if self.python_rngs is not None:
            random.setstate(self.python_rngs["random"])
            numpy_state = self.python_rngs["numpy"]
            np.random.set_state(
                (
                    "MT19937",
                    numpy_state["keys"].numpy().astype(np.uint32),
                    numpy_state["pos"],
                    numpy_state["has_gauss"],
                    numpy_state["gauss"],
                )
            )


def python_rngs() -> dict[str, Any]:
    """``random``'s and NumPy's global RNG states, in a ``weights_only``-loadable form."""
    saved: tuple[Any, ...] = np.random.get_state(legacy=True)  # type: ignore[assignment]
    _, keys, pos, has_gauss, gauss = saved
    return {
        "random": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
    }


def loader_fingerprint(
    dataset: Any, sampler: Any, batch_sampler: Any, batch_size: Any, drop_last: bool
) -> dict[str, str]:
    """What a state records about the loader it came from (cheap: types and lengths).

    Example:
        >>> loader_fingerprint(list(range(9)), None, None, 4, False)["dataset"]
        'list of 9 items'
    """
    return {
        "dataset": describe(dataset),
        "sampler": describe(sampler),
        "batch_sampler": describe(batch_sampler),
        "batch_size": describe(batch_size),
        "drop_last": describe(drop_last),
    }


def sampler_generators(generator: Any, sampler: Any, batch_sampler: Any) -> list[torch.Generator]:
    """The random generators the epochs draw from, each once: saved and restored by states."""
    found: list[torch.Generator] = []
    for candidate in (generator, sampler, batch_sampler, getattr(batch_sampler, "sampler", None)):
        own = (
            candidate
            if isinstance(candidate, torch.Generator)
            else getattr(candidate, "generator", None)
        )
        if isinstance(own, torch.Generator) and all(g is not own for g in found):
            found.append(own)
    return found


def read_state(
    state: Any,
    *,
    kind: str,
    generators: int,
    fingerprint: dict[str, str],
    strict: bool,
    resumer: tuple[int, bool, bool] = (0, True, False),
) -> CompatState:
    """Check every field of ``state`` (and, with ``strict``, its fingerprint).

    ``resumer``: the loading loader's ``num_workers``, whether it delivers
    batches in order, and whether it fetches item by item (economic, chunked).

    Raises:
        StateError: naming the field that is wrong, or what differs from this loader.
    """
    version = state.get("version") if isinstance(state, dict) else None
    if type(version) is not int or version not in (STATE_VERSION, _UNCHECKED_VERSION):
        got = version if isinstance(state, dict) else type(state).__name__
        raise StateError(
            f"expected a compat DataLoader state of version {STATE_VERSION} (or "
            f"{_UNCHECKED_VERSION}, from older pipeloom), got {got!r}; pass what "
            f"pipeloom.compat.DataLoader.state_dict() returned"
        )
    fields = StateFields(_OWNER, state)
    if state.get("kind") not in ("map", "iterable"):
        fields.fail("kind", "'map' or 'iterable'", state.get("kind"))
    if state["kind"] != kind:
        raise StateError(
            f"this state was saved by a loader over a {state['kind']}-style dataset, but "
            f"this loader reads a {kind}-style one; build the loader as it was built"
        )
    if strict:
        _check_fingerprint(state, fingerprint)
    saved = fields.list("generators")
    if len(saved) != generators:
        raise StateError(
            f"the state holds {len(saved)} sampler generator(s) but this loader has "
            f"{generators}; pass the same generator/sampler arguments"
        )
    for value in saved:
        if not _is_rng_state(value):
            fields.fail("generators", "a list of torch.Generator states (uint8 tensors)", value)
    global_rng = state.get("global_rng", "(absent)")
    if global_rng is not None and not _is_rng_state(global_rng):
        fields.fail("global_rng", "None or torch's RNG state (a uint8 tensor)", global_rng)
    epoch = _read_epoch(fields, state.get("epoch", "(absent)"), kind)
    if epoch is not None:
        _check_resumer(epoch, kind, *resumer)
    return CompatState(
        epoch=epoch,
        workers_base_seed=fields.optional_int("workers_base_seed", minimum=None),
        epochs=fields.optional_int("epochs", default=None) or 0,  # absent from older states
        generators=saved,
        global_rng=global_rng,
        python_rngs=_read_python_rngs(fields, state.get("python_rngs")),
    )


def _read_python_rngs(fields: StateFields, saved: Any) -> dict[str, Any] | None:
    if saved is None:
        return None
    expected = "None or {'random': random.getstate(), 'numpy': {'keys', 'pos', ...}}"
    if not isinstance(saved, dict) or not isinstance(saved.get("numpy"), dict):
        fields.fail("python_rngs", expected, saved)
    try:
        random.Random().setstate(saved["random"])
        numpy = saved["numpy"]
        keys = numpy["keys"]
        if not _is_index_tensor(keys) or len(keys) != 624:
            raise TypeError("keys")
        np.random.RandomState().set_state(
            (
                "MT19937",
                keys.numpy().astype(np.uint32),
                numpy["pos"],
                numpy["has_gauss"],
                numpy["gauss"],
            )
        )
    except (KeyError, TypeError, ValueError, OverflowError):
        fields.fail("python_rngs", expected, saved)
    return saved


def _read_epoch(fields: StateFields, epoch: Any, kind: str) -> dict[str, Any] | None:
    if epoch is None:
        return None
    if not isinstance(epoch, dict):
        fields.fail("epoch", "None or the interrupted epoch (a dict)", epoch)
    inner = StateFields(f"{_OWNER} (its epoch)", epoch)
    entries = None if kind == "iterable" else _read_entries(inner, epoch.get("entries"))
    delivered = inner.int("delivered", maximum=None if entries is None else len(entries))
    first = inner.optional_int("first", default=None) or 0
    plan = EpochPlan(
        PlanEntries(objects=[]) if entries is None else entries,
        inner.int("base_seed", minimum=None),
        # absent from older states: their draws restarted at the plan's first entry
        first=first,
        first_index=inner.optional_int("first_index", default=None) or 0,
        epoch=inner.optional_int("plan_epoch", default=None) or 0,
        skip=_read_skip(inner, epoch.get("skip", []), first, entries),
    )
    workers = inner.optional_int("workers", default=None)  # absent: map-style, older states
    outputs = epoch.get("outputs", [])
    readers = 1 if workers is None else max(1, workers)
    if not isinstance(outputs, list) or not all(type(k) is int and k >= 0 for k in outputs):
        inner.fail("outputs", "a list of output counts (ints >= 0), one per worker", outputs)
    if outputs and len(outputs) != readers:
        inner.fail("outputs", f"{readers} counts (one per worker)", outputs)
    plan = replace(plan, outputs=tuple(outputs))
    return {"plan": plan, "delivered": delivered, "workers": workers}


def _read_skip(
    fields: StateFields, skip: Any, first: int, entries: Entries | None
) -> frozenset[int]:
    """The positions a plan leaves out: ints after ``first``, within its entries."""
    end = None if entries is None else first + len(entries)
    if not isinstance(skip, list) or not all(
        type(p) is int and p > first and (end is None or p < end) for p in skip
    ):
        fields.fail("skip", f"a list of positions after first={first}, within the plan", skip)
    return frozenset(skip)


def _check_resumer(
    epoch: dict[str, Any], kind: str, workers: int, in_order: bool, per_item: bool
) -> None:
    """Refuse to resume an epoch where this loader would deliver other batches."""
    saved = epoch["workers"]
    if kind == "iterable" and saved is not None and saved != workers:
        raise StateError(
            f"this state was saved in the middle of an epoch by a loader with "
            f"num_workers={saved}, over an IterableDataset: each worker reads its own copy "
            f"of the dataset, so the epoch's batches depend on the worker count, and the rest "
            f"of that epoch cannot be found with num_workers={workers}. Resume with "
            f"num_workers={saved}, or save checkpoints between epochs (an epoch can then "
            f"start with any worker count)"
        )
    if kind == "iterable" and not in_order and epoch["delivered"]:
        raise StateError(
            "this state, from an older pipeloom, counts the batches of an IterableDataset "
            "delivered in order, but this loader delivers them in arrival order "
            "(in_order=False); resume it with in_order=True"
        )
    if epoch["plan"].skip and per_item:
        raise StateError(
            "this state was saved by a loader that delivered batches in arrival order "
            "(in_order=False), so the rest of its epoch has gaps, which a loader that "
            "fetches item by item cannot leave; resume it with strategy='classic'"
        )


def _read_entries(fields: StateFields, entries: Any) -> PlanEntries | RangeEntries:
    """``PlanEntries.to_state()`` back, its arrays checked."""
    expected = (
        "{'objects': list}, {'flat': 1-D int64 tensor[, 'offsets': ...]} or "
        "{'recipe': {...}, 'start': int}"
    )
    if not isinstance(entries, dict):
        fields.fail("entries", expected, entries)
    if "recipe" in entries:
        try:
            drawn = EpochRecipe.from_state(entries["recipe"]).draw()
        except ValueError as error:
            fields.fail("entries", f"{expected} ({error})", entries)
        start = entries.get("start")
        if type(start) is not int or not 0 <= start <= len(drawn):
            fields.fail("entries", f"a 'start' from 0 to {len(drawn)}", start)
        return drawn.tail(start)
    if "objects" in entries:
        if not isinstance(entries["objects"], (list, tuple)):
            fields.fail("entries", expected, entries)
        return PlanEntries.from_state(entries)
    flat, offsets = entries.get("flat"), entries.get("offsets")
    if not _is_index_tensor(flat):
        fields.fail("entries", expected, entries)
    if offsets is not None:
        good = _is_index_tensor(offsets) and len(offsets) >= 1
        if good:
            steps = np.diff(offsets.numpy())
            good = int(offsets[0]) == 0 and int(offsets[-1]) == len(flat) and bool(all(steps >= 0))
        if not good:
            fields.fail(
                "entries",
                "batch offsets from 0 to len(flat), never decreasing (a 1-D int64 tensor)",
                offsets,
            )
    return PlanEntries.from_state(entries)


def _check_fingerprint(state: dict[str, Any], now: dict[str, str]) -> None:
    if state["version"] == _UNCHECKED_VERSION:
        warnings.warn(
            "this compat DataLoader state was saved by an older pipeloom (state version 1), "
            "which did not record the dataset's fingerprint, so it is loaded without checking "
            "that it comes from this dataset and sampler; a state saved now carries the check "
            "(pass strict=False to load old states without this warning)",
            UserWarning,
            stacklevel=4,
        )
        return
    saved = state.get("fingerprint")
    if not isinstance(saved, dict) or not all(isinstance(v, str) for v in saved.values()):
        differences = ["the state's fingerprint is damaged (expected a dict of strings)"]
    else:
        differences = field_differences(saved, now)
    if differences:
        raise StateError(
            "this state was saved from a loader over a different dataset or sampler, so its "
            "indices would point at other samples:\n  "
            + "\n  ".join(differences)
            + "\nBuild the loader as it was built when the state was saved; if the change is "
            "intended, load it with load_state_dict(state, strict=False)"
        )


def _is_rng_state(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1


def _is_index_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.int64 and value.dim() == 1
