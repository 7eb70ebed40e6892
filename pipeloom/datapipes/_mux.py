"""Interleaving streams: round-robin, or mixed at chosen proportions.

Which source the k-th output comes from is a pure function of how many items
each source gave so far (and, for ``sampling="random"``, of the block's epoch
seed and k), so the mix is the same under every reading service, and its state
is a handful of counts.

The smooth rule (the default) is Tijdeman's solution of the "chairman
assignment" problem, in exact integers. Weights are read exactly (floats as
the decimals they print as: ``0.7`` is 7/10) and give each source ``i`` its
share ``p[i] = w[i] / W`` among the ``k`` sources in the mix. With ``c[i]``
items taken from each so far and ``n = sum(c) + 1`` the output being chosen,
a source is *eligible* when it is owed at least ``1 / (2k - 2)`` items
(``n * p[i] - c[i] >= 1 / (2k - 2)``); among the eligible, the one whose
deadline comes first -- the output at which it would be ``1 - 1 / (2k - 2)``
items behind -- is chosen, the lowest index on ties. Then after every output
each source is within ``1 - 1 / (2k - 2)`` items of its share ``n * p[i]``
(half an item for two sources, under one item for any number), so the ratio
error after ``n`` outputs is below ``1 / n``; integer weights repeat with
period ``W``, and equal weights give plain round-robin.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from ..errors import StateError
from ._base import IterDataPipe
from ._context import current_stamp, derive_seed, restore_stamp
from ._pipeline import reset_pipeline, set_input_round
from ._state_fields import StateFields
from ._zip import check_inputs

__all__ = ["Multiplexer"]

STOPS = ("first", "all", "cycle")
SAMPLINGS = ("smooth", "random")
_NO_STAMP: tuple = (None, 0, None, 0)


class Multiplexer(IterDataPipe):
    """Interleave streams, round-robin or at chosen proportions (functional: ``mux``).

    Without ``weights``, with ``stop="first"`` and ``sampling="smooth"`` (the
    defaults) this is torchdata's ``mux``:
    rounds of one item per stream, ending (and dropping the incomplete round)
    when any stream is exhausted. Otherwise each output is taken from one
    source chosen by ``sampling`` (unweighted means equal weights):

    * ``"smooth"`` (default): deterministic (the rule is in the module
      docstring). Every prefix of the output holds each source within one item
      of its share, so short runs and every batch see the intended mix.
    * ``"random"``: output ``k`` comes from source ``i`` with probability
      ``w[i] / W``, drawn from the block's epoch seed and ``k``: a new order each
      epoch, and shares that drift like a random walk.

    ``stop`` says what an exhausted source does:

    * ``"first"``: the output ends at the first source that runs out.
    * ``"all"``: that source leaves the mix; the others continue in their
      relative proportions until every source has run out.
    * ``"cycle"``: that source restarts (a new round: new seeds upstream, as
      ``cycle`` does), until every source with a positive weight has run out at
      least once. A source that yields nothing in a round leaves the mix.
      Under thread or process workers, restart only sources read in the main
      process or upstream of the sharding point, not one merged from workers.

    Resuming with other weights: the state holds the counts ``c`` and the
    weights they were taken with. Loaded into a block with different weights,
    the counts restart at zero, so the outputs after the resume follow the new
    proportions as if the mix started there; what was already delivered is not
    compensated for.

    Args:
        datapipes: the streams to mix.
        weights: one number ``>= 0`` per stream (at least one positive), or None.
        stop: ``"first"``, ``"all"`` or ``"cycle"`` (see above).
        sampling: ``"smooth"`` or ``"random"`` (see above).
        seed: this block's own seed for ``sampling="random"`` (otherwise the
            pipeline seed is used).

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> a, b = IterableWrapper(range(3)), IterableWrapper(range(10, 15))
        >>> list(Multiplexer(a, b))
        [0, 10, 1, 11, 2, 12]
        >>> list(Multiplexer(a, b, stop="all"))
        [0, 10, 1, 11, 2, 12, 13, 14]
        >>> list(Multiplexer(a, b, weights=[1, 3], stop="all"))
        [10, 0, 11, 12, 13, 1, 14, 2]
    """

    inputs = ("datapipes",)
    resume_may_change = ("weights",)  # load_state_dict starts the counts afresh

    def __init__(
        self,
        *datapipes: IterDataPipe,
        weights: Sequence[float] | None = None,
        stop: str = "first",
        sampling: str = "smooth",
        seed: int | None = None,
    ) -> None:
        self.datapipes = check_inputs("mux", datapipes, IterDataPipe)
        if stop not in STOPS:
            raise ValueError(
                f"stop must be one of {', '.join(map(repr, STOPS))}, got {stop!r}: 'first' "
                f"ends at the first exhausted source, 'all' when all are, 'cycle' restarts "
                f"exhausted sources until each ran out once"
            )
        if sampling not in SAMPLINGS:
            raise ValueError(
                f"sampling must be 'smooth' (deterministic proportions) or 'random' "
                f"(a seeded draw per output), got {sampling!r}"
            )
        if isinstance(weights, (Mapping, str, bytes)):
            raise TypeError(
                f"mux() expects weights to be a sequence of numbers, one per source in the "
                f"order the sources are given, got {type(weights).__name__} {weights!r}; pass "
                f"e.g. weights=[0.7, 0.3]"
            )
        self.weights = None if weights is None else tuple(weights)
        self._int_weights = _integer_weights(self.weights, len(self.datapipes))
        self.stop = stop
        self.sampling = sampling
        self.seed = seed
        self.use_own_seed(seed)
        self._rounds_mode = weights is None and stop == "first" and sampling == "smooth"
        self.reset()

    def reset(self) -> None:
        restarted = self._round_number()  # this mix repeated by a block further down
        for dp, round_number in zip(self.datapipes, getattr(self, "_rounds", ())):
            if round_number or restarted:  # a restarted source starts again at round 0
                set_input_round(self, dp, 0)
        count = len(self.datapipes)
        # torchdata's mux: the round being read, the complete round being emitted.
        self._filling: list[tuple[Any, Any]] = []
        self._ready: list[tuple[Any, Any]] = []
        self._emitted = 0
        # The proportional schedule.
        self._counts = [0] * count  # items per source since the weights took effect
        self._drawn = 0  # outputs this epoch (the index of random draws)
        self._gone = [False] * count  # left the mix (stop="all", or empty under "cycle")
        self._ran_out = [False] * count  # exhausted at least once
        self._rounds = [0] * count
        self._yielded = [False] * count  # whether the source's current round gave an item
        # Each source's item stamp as it left it: a source that emits several items per
        # position (a tar shard) goes on from its own stamp, as it would alone in a worker.
        self._contexts: list[tuple] = [_NO_STAMP] * count
        self._done = False

    @property
    def restarts_inputs(self) -> bool:
        return self.stop == "cycle"

    # -- iteration --------------------------------------------------------------
    def async_next(self) -> Any:
        if self._rounds_mode:
            return self._next_of_round()
        while True:
            if self._done:
                raise StopIteration
            index = self._choose()
            try:
                item = self._pull(index)  # NotAvailable: the same choice next time
            except StopIteration:
                self._exhausted(index)
                continue
            self._counts[index] += 1
            self._drawn += 1
            self._yielded[index] = True
            return item

    def _pull(self, index: int) -> Any:
        restore_stamp(self._contexts[index])
        try:
            return self.datapipes[index].async_next()
        finally:
            self._contexts[index] = current_stamp()

    def _choose(self) -> int:
        weights, gone = self._int_weights, self._gone
        active = [i for i, w in enumerate(weights) if w and not gone[i]]
        total = sum(weights[i] for i in active)
        if self.sampling == "random":
            point = derive_seed(self.epoch_seed(), self._drawn) * total >> 63
            for i in active:
                point -= weights[i]
                if point < 0:
                    return i
        if len(active) == 1:
            return active[0]
        # Tijdeman's rule, in integers: among the sources owed at least `slack` items,
        # the one that would soonest fall `1 - slack` items behind its share.
        counts, spread = self._counts, 2 * len(active) - 2  # slack = 1 / spread
        n = sum(counts[i] for i in active) + 1
        best, best_deadline = -1, -1
        for i in active:
            if (n * weights[i] - counts[i] * total) * spread < total:
                continue  # owed less than the slack: not eligible
            deadline = -(-((counts[i] + 1) * spread - 1) * total // (weights[i] * spread))
            if best < 0 or deadline < best_deadline:
                best, best_deadline = i, deadline
        return best

    def _exhausted(self, index: int) -> None:
        if self.stop == "first":
            self._done = True
            return
        self._ran_out[index] = True
        mixed = [i for i, w in enumerate(self._int_weights) if w]
        if self.stop == "cycle" and all(self._ran_out[i] for i in mixed):
            self._done = True  # every source was read through at least once
        elif self.stop == "all" or not self._yielded[index]:
            self._gone[index] = True
            self._done = all(self._gone[i] for i in mixed)
        else:  # cycle: restart the source, with new seeds upstream
            self._rounds[index] += 1
            set_input_round(self, self.datapipes[index], self._rounds[index])
            reset_pipeline(self.datapipes[index])
            self._contexts[index] = _NO_STAMP
        self._yielded[index] = False

    def _next_of_round(self) -> Any:
        ready, emitted = self._ready, self._emitted
        if emitted >= len(ready):
            ready, emitted = self._read_round(), 0
        self._emitted = emitted + 1
        item, stamp = ready[emitted]
        restore_stamp(stamp)
        return item

    def _read_round(self) -> list[tuple[Any, Any]]:
        if self._done:
            raise StopIteration
        filling = self._filling
        try:
            for index in range(len(filling), len(self.datapipes)):
                filling.append((self._pull(index), current_stamp()))
        except StopIteration:
            self._done = True
            filling.clear()
            raise
        self._ready, self._filling, self._emitted = filling, [], 0
        return filling

    def __len__(self) -> int:
        if self._rounds_mode:
            return min(len(dp) for dp in self.datapipes) * len(self.datapipes)
        if self.weights is None and self.stop == "all":
            return sum(len(dp) for dp in self.datapipes)
        raise TypeError(
            f"{self!r} has no length: how many items it takes from each source depends on "
            f"the weights and on which source runs out first"
        )

    # -- checkpoints --------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self._rounds_mode:
            return {
                "filling": list(self._filling),
                "ready": list(self._ready),
                "emitted": self._emitted,
                "done": self._done,
                "contexts": list(self._contexts),
            }
        return {
            "weights": list(self._int_weights),
            "counts": list(self._counts),
            "drawn": self._drawn,
            "gone": list(self._gone),
            "ran_out": list(self._ran_out),
            "rounds": list(self._rounds),
            "yielded": list(self._yielded),
            "contexts": list(self._contexts),
            "done": self._done,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        count = len(self.datapipes)
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        if self._rounds_mode:
            if isinstance(state, dict) and "filling" not in state:
                raise StateError(
                    f"this state is a weighted mux state (keys {keys}), but this mux "
                    f"has no weights: it mixes in rounds; build it with weights (e.g. the "
                    f"ones it was saved with), or load the state into the pipeline that saved it"
                )
            fields = StateFields(self, state)
            filling, ready = fields.stamped_items("filling"), fields.stamped_items("ready")
            if len(filling) >= count:
                fields.fail(
                    "filling", f"the items of a round being read, fewer than {count}", filling
                )
            if len(ready) not in (0, count):
                fields.fail("ready", f"a complete round of {count} items, or none", ready)
            self._filling, self._ready = filling, ready
            self._emitted = fields.int("emitted", maximum=len(ready))
            self._done = fields.bool("done")
            self._load_contexts(fields)
            return
        counts = state.get("counts") if isinstance(state, dict) else None
        if not isinstance(counts, (list, tuple)) or len(counts) != count:
            raise StateError(
                f"this state is not a weighted mux state over {count} sources "
                f"(got keys {keys}); load it into the pipeline that saved it"
            )
        fields = StateFields(self, state)
        weights = _saved(fields, "weights", count, "ints >= 0", _is_count)
        if not any(weights):
            fields.fail("weights", "weights with at least one positive", weights)
        counts = _saved(fields, "counts", count, "ints >= 0", _is_count)
        drawn = fields.int("drawn", minimum=sum(counts))  # every count is of outputs drawn
        flags = {
            name: _saved(fields, name, count, "bools", _is_flag)
            for name in ("gone", "ran_out", "yielded")
        }
        rounds = _saved(fields, "rounds", count, "ints >= 0", _is_count)
        same_weights = _proportions(weights) == _proportions(self._int_weights)
        self._counts = counts if same_weights else [0] * count
        self._drawn, self._rounds = drawn, rounds
        self._gone, self._ran_out, self._yielded = flags["gone"], flags["ran_out"], flags["yielded"]
        self._done = fields.bool("done")
        self._load_contexts(fields)
        for dp, round_number in zip(self.datapipes, self._rounds):
            if round_number or self._round_number():
                set_input_round(self, dp, round_number)

    def _load_contexts(self, fields: StateFields) -> None:
        count = len(self.datapipes)
        if "contexts" not in fields.state:  # absent from states saved before it was kept
            self._contexts = [_NO_STAMP] * count
        else:
            self._contexts = fields.stamps("contexts", length=count)

    def __repr__(self) -> str:
        if self._rounds_mode:
            return "Multiplexer()"
        weights = "" if self.weights is None else f"weights={list(self.weights)!r}, "
        return f"Multiplexer({weights}stop={self.stop!r}, sampling={self.sampling!r})"


def _integer_weights(weights: tuple[Any, ...] | None, count: int) -> list[int]:
    """Weights as integers in the same proportions (floats read as their decimal text)."""
    if weights is None:
        return [1] * count
    if len(weights) != count:
        raise ValueError(
            f"mux() got {count} sources but {len(weights)} weights; give one per source"
        )
    exact: list[Fraction] = []
    for weight in weights:
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
            raise TypeError(
                f"mux() weights must be numbers, got {type(weight).__name__} {weight!r}; pass "
                f"plain numbers (a tensor's .tolist(), for instance)"
            )
        value = float(weight)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"mux() weights must be finite and >= 0, got {weight!r}")
        if isinstance(weight, numbers.Integral):
            exact.append(Fraction(operator.index(weight)))
        else:
            exact.append(Fraction(repr(value)))
    if not any(exact):
        raise ValueError(f"mux() needs at least one positive weight, got {list(weights)!r}")
    scale = math.lcm(*(f.denominator for f in exact))
    return [int(f * scale) for f in exact]


def _saved(fields: StateFields, name: str, count: int, kind: str, valid: Any) -> list[Any]:
    """Field ``name``: one value per source, each ``valid``."""
    values = fields.list(name)
    if len(values) != count or not all(valid(value) for value in values):
        fields.fail(name, f"a list of {count} {kind} (one per source)", values)
    return values


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_flag(value: Any) -> bool:
    return isinstance(value, bool)


def _proportions(weights: Sequence[int]) -> list[int]:
    divisor = math.gcd(*weights) or 1
    return [int(w) // divisor for w in weights]
