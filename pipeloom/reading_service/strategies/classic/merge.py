"""The classic strategy's merge: the workers' outputs in the order of their source positions.

Each worker sends ``Output`` triples ``(key, draws, item)`` (``key``: the
item's position ``p``, or ``(p, j, ...)`` for output ``j`` of the item at
``p``; ``draws``: item seeds already drawn for the item, so ``item_rng()``
continues where it was) in increasing position order, then ``END``. Position ``p`` belongs to
worker ``(p // group_size) % num_workers``. The merge walks positions in
order and asks only the owner of the current position, so the result is the
in-process order whatever the timing; a worker whose next output is past
``p`` has dropped ``p`` (e.g. a ``filter``), and several outputs at ``p`` (a
``flatmap``) come out together.
With ``in_order=False`` outputs are taken from whichever worker has one ready;
a resume still drops the outputs the checkpoint delivered (by their group).

Under *outer sharding* (this process is shard ``r`` of ``R``, e.g. a rank)
worker ``i`` of ``n`` holds shard ``i * R + r`` of ``R * n``: group ``q = p //
group_size`` belongs here iff ``q % R == r`` (as when one process keeps shard
``r`` of ``R``, whatever ``n``), its owner is worker ``(q // R) % n``, and the
merge jumps over the other processes' groups arithmetically
(:func:`next_owned_group`).

In the rest of an epoch resumed on another number of ranks (``RestOfEpoch``)
the walk is over *virtual* positions, the undelivered positions numbered
again; a worker's output at real position ``p`` sits at ``rest.virtual(p)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ....datapipes import IterDataPipe, StateFields
from ....datapipes.runtime import RestOfEpoch, key_position, restore_stamp
from ....errors import NotAvailable, StateError, WorkerError
from ....events import ReadinessSource
from ...workers.failure import Failure
from ...workers.messages import END

__all__ = ["WorkerChannel", "WorkerMerge", "next_owned_group"]


def next_owned_group(group: int, outer: tuple[int, int] = (1, 0)) -> int:
    """The first group number ``>= group`` of outer shard ``outer = (R, r)``: ``q % R == r``.

    Example:
        >>> [next_owned_group(q, (3, 1)) for q in range(7)]
        [1, 1, 4, 4, 4, 7, 7]
    """
    total, index = outer
    return group + (index - group) % total


def _position_of(output: tuple) -> int:
    position = key_position(output[0])
    if position is None:
        raise RuntimeError(
            "a worker sent an output without a position: the sharding point or a block "
            "after it replaced the item stamp with none; a block that hands items out later "
            "must keep their stamps (item_stamp()/set_item_stamp())"
        )
    return position


class WorkerChannel(Protocol):
    """The main process's view of one worker's output."""

    def get_nowait(self) -> Any:
        """The next message, or raise ``NotAvailable``; raises if the worker died."""

    def readiness(self) -> Sequence[ReadinessSource]:
        """Where to wait for the next message (or for the worker's death)."""


class WorkerMerge(IterDataPipe):
    """The workers' outputs as one stream, in source-position order."""

    inputs = ()
    restartable = False  # its stream is produced once per epoch
    #: It stands in for the sharding point, which ran in the workers: a shardable block
    #: after the merge (a redundant ``sharding_filter()``) keeps the workers' positions
    #: instead of numbering the merged stream again, as it does in-process.
    stands_in_for_sharding_point = True

    def __init__(
        self,
        *,
        group_size: int = 1,
        in_order: bool = True,
        single_output: bool = False,
        outer: tuple[int, int] = (1, 0),
    ) -> None:
        self.group_size = group_size
        self.in_order = in_order
        self.single_output = single_output
        self.outer = outer  # (total, index): this process's shard (see the module docstring)
        self.channels: list[WorkerChannel] = []
        self._stamp_seed: int | None = None
        self._stamp_epoch = 0
        self.rest: RestOfEpoch | None = None
        self.reset()

    def attach(self, channels: Sequence[WorkerChannel], *, seed: int | None, epoch: int) -> None:
        """Read this epoch from ``channels``, stamping items with ``seed`` and ``epoch``."""
        self.channels = list(channels)
        self._heads: list[Any] = [None] * len(self.channels)
        self._ended = [False] * len(self.channels)
        self._stamp_seed, self._stamp_epoch = seed, epoch

    def reset(self) -> None:
        self.rest = None
        self._position = 0
        # Outputs delivered in the group of self._position, and how many of them a
        # resume skips (delivered before the checkpoint). A group (runs of
        # group_size positions, one batch built in a worker) is the unit a resume
        # restarts: a worker cannot start a batch in its middle.
        self._delivered_here = 0
        self._skip_here = 0
        self._next_channel = 0
        self._rest_skipped: dict[int, int] = {}  # in arrival order: group -> outputs skipped
        self._heads = [None] * len(self.channels)
        self._ended = [False] * len(self.channels)

    def readiness_sources(self) -> Sequence[ReadinessSource]:
        return [source for channel in self.channels for source in channel.readiness()]

    def async_next(self) -> Any:
        if self.in_order:
            position, draws, item = self._next_in_order()
        else:
            position, draws, item = self._next_any()
        restore_stamp((self._stamp_seed, self._stamp_epoch, position, draws))
        return item

    def _head(self, worker: int) -> Any:
        head = self._heads[worker]
        if head is None:
            head = self.channels[worker].get_nowait()  # NotAvailable propagates
            if isinstance(head, Failure) and not self._raises_in_order(head):
                head.raise_here()
            if head is END:
                self._ended[worker] = True
            self._heads[worker] = head
        return head

    def _next_in_order(self) -> tuple[int, int, Any]:
        workers = len(self.channels)
        while True:
            if all(self._ended) and all(h is END or h is None for h in self._heads):
                raise StopIteration
            position = self._position
            group = position // self.group_size
            total = self.outer[0]
            if total != 1:
                owned = next_owned_group(group, self.outer)
                if owned != group:  # another process's group: jump over
                    group, position = owned, owned * self.group_size
                    self._advance_to(position)
                group //= total  # the owner counts this process's groups only
            owner = group % workers
            try:
                head = self._head(owner)
            except WorkerError as error:  # a death found while waiting for ``position``
                self._name_lost_work(error, owner, position)
                raise
            if isinstance(head, Failure):  # raised at its item's position, as in-process
                if head.item is None or position >= head.item:
                    head.raise_here()
                self._advance_to(position + 1)  # the outputs before it come first
                continue
            if head is END or self._virtual(head) > position:  # nothing (more) here
                self._advance_to(position + 1)
                continue
            self._heads[owner] = None
            if self._skip_here:  # delivered before the checkpoint this resumes from
                self._skip_here -= 1
                self._delivered_here += 1
                continue
            if self.single_output:  # the group is complete: do not wait for more
                self._advance_to((position // self.group_size + 1) * self.group_size)
            else:
                self._delivered_here += 1
            return head

    def _name_lost_work(self, error: WorkerError, owner: int, position: int) -> None:
        """Say what the dead worker was making: the output the merge waited for from it
        (its queue was empty, so it had sent everything before)."""
        if error.original_type is not None or error.item is not None:
            return  # an error of the worker's code, which names its own item
        worker = getattr(self.channels[owner], "worker", None)
        if worker is None or getattr(worker, "label", None) != error.worker:
            return  # another worker's death, found on the way
        size = self.group_size
        if size == 1:
            work = f"the item at position {position}, or one after it if it dropped that one"
        else:
            first = position // size * size
            work = f"the batch of the items at positions {first}-{first + size - 1}"
        error.add_detail(f". It was making {work}", item=position)

    def _raises_in_order(self, failure: Failure) -> bool:
        """Whether ``failure`` waits for its position (else it is raised when read).

        A worker's error names the position of the item it was making (or, for a
        source error, of the last one it read): the outputs of other workers at
        earlier positions are delivered first, as the in-process run delivers them.
        """
        return self.in_order and self.rest is None and isinstance(failure.item, int)

    def _advance_to(self, position: int) -> None:
        size = self.group_size
        if position // size != self._position // size:  # a new group
            self._delivered_here = 0
            self._skip_here = 0 if self.rest is None else self.rest.skip(position // size)
        self._position = position

    def _virtual(self, output: tuple) -> int:
        position = _position_of(output)
        if self.rest is None:
            return position
        virtual = self.rest.virtual(position)
        assert virtual is not None, "a worker sent a position the rest of the epoch excludes"
        return virtual

    def resume_rest(self, rest: RestOfEpoch) -> None:
        """Walk the rest of an epoch resumed on another number of ranks (module docstring)."""
        self.rest = rest
        self._position = rest.start
        self._rest_skipped = {}
        self._delivered_here = 0
        self._skip_here = rest.skip(rest.start // self.group_size)

    def resume_point(self) -> int | RestOfEpoch:
        """Where the workers start after a resume: a position, or the rest from a virtual one."""
        if self.rest is None:
            return self.resume_position
        return self.rest.from_virtual(self.resume_position)

    def _next_any(self) -> tuple[int, int, Any]:
        workers = len(self.channels)
        for offset in range(workers):
            worker = (self._next_channel + offset) % workers
            while not self._ended[worker]:
                try:
                    head = self._head(worker)
                except NotAvailable:
                    break
                if head is END:
                    break
                self._heads[worker] = None
                if self._delivered_before_resume(head):
                    continue
                self._next_channel = (worker + 1) % workers
                return head
        if all(self._ended):
            raise StopIteration
        raise NotAvailable

    def _delivered_before_resume(self, output: tuple) -> bool:
        """Whether arrival order drops ``output``: the checkpoint resumed from delivered it.

        A resume restarts the workers at the first position of a group (a batch
        built in a worker, the outputs of one ``flatmap`` input) of which the
        first few outputs were delivered; in arrival order there is no walk of
        positions to skip them, so each is recognised by its group: its owner
        sends them before anything else of that group.
        """
        group = self._virtual(output) // self.group_size
        if group == self._position // self.group_size:
            if not self._skip_here:
                return False
            self._skip_here -= 1
            return True
        if self.rest is None:
            return False
        skipped = self._rest_skipped.get(group, 0)  # the rest's other half-delivered groups
        if skipped >= self.rest.skip(group):
            return False
        self._rest_skipped[group] = skipped + 1
        return True

    @property
    def exhausted(self) -> bool:
        """True once every worker's END was read (the workers finished the epoch)."""
        return all(self._ended)

    @property
    def resume_position(self) -> int:
        """The first position workers must produce again after a resume (a group's first)."""
        return self._position - self._position % self.group_size

    def state_dict(self) -> dict[str, Any]:
        if not self.in_order:
            raise StateError(
                "a reading service with in_order=False delivers items in arrival order, "
                "which cannot be replayed; use in_order=True (the default) to checkpoint"
            )
        state: dict[str, Any] = {
            "position": self.resume_position,
            # a resume's skip not yet passed: those outputs were delivered before it
            "delivered_here": self._delivered_here + self._skip_here,
        }
        if self.rest is not None:
            state["rest"] = self.rest.to_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = StateFields(self, state)
        position = fields.int("position")
        rest = state.get("rest")
        self.rest = None if rest is None else RestOfEpoch.from_dict(rest)
        self._position = position - position % self.group_size
        self._skip_here = fields.int("delivered_here")
        self._delivered_here = 0

    def __repr__(self) -> str:
        return f"WorkerMerge(workers={len(self.channels)}, in_order={self.in_order})"
