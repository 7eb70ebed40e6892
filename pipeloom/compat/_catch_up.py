"""What torch's persistent workers still fetch of an abandoned epoch before the next one.

torch's iterator hands its workers ``prefetch_factor * num_workers`` batches
at ``iter()`` and one more for each batch ``next()`` returns (or raises), batch
``i`` to worker ``i % num_workers``. After a ``break`` the next ``iter()``
(``_reset``) puts a ``_ResumeIteration`` behind those tasks and waits for
every worker to answer it: each worker has then fetched every batch it was
sent, whose results are dropped. So when the next epoch starts, worker ``w``
has fetched exactly its batches at positions under ``asked +
prefetch_factor * num_workers`` (``asked``: the batches ``next()`` returned or
raised), and its global RNG streams run on from there -- whatever the timing.

pipeloom's workers make at most that many (each holds ``prefetch_factor``
outputs ahead of the consumer, and stops when the epoch is cancelled), maybe
fewer. The compat loader publishes the difference with the next epoch's plan
as a :class:`CatchUp`; each worker fetches its part of it, drops the results
(and errors) as torch does, then starts the new epoch.

An ``IterableDataset``'s worker ``w`` is sent its outputs ``w, w + n, ...``
the same way, so it has made ``delivered_w + prefetch_factor`` outputs (fewer
if its iterator ran out). When one worker ran out during the epoch, torch
hands the others the tasks it would have had from the moment it *learns* of
it, which depends on timing; the catch-up then follows the count of a main
process that had not learned it yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._iterator import EpochRest

__all__ = ["CatchUp", "catch_up_after", "torch_requests"]


@dataclass(frozen=True)
class CatchUp:
    """The fetches persistent workers owe an abandoned epoch, published with the next one.

    Attributes:
        after: the serial of the abandoned plan: a worker that did not run it (a
            new process) owes nothing.
        entries: map-style: ``(position, sampler output)`` of the batches torch's
            workers were sent and that were not delivered; each worker fetches its
            own ones it did not fetch yet.
        outputs: an ``IterableDataset``'s: how many outputs worker ``i`` makes in all.
    """

    after: int
    entries: tuple[tuple[int, Any], ...] = ()
    outputs: tuple[int, ...] = ()


def torch_requests(rest: EpochRest, ahead: int) -> int:
    """How many sampler outputs torch's iterator asked for in the epoch ``rest`` left.

    ``ahead``: ``prefetch_factor * num_workers`` (0 without workers).

    Example:
        >>> from pipeloom.compat._iterator import EpochRest
        >>> from pipeloom.compat._plan import EpochPlan, PlanEntries
        >>> plan = EpochPlan(PlanEntries.from_outputs([0, 1, 2, 3, 4]), base_seed=0)
        >>> torch_requests(EpochRest(plan, 2, False, 2, None), ahead=4)
        6
    """
    return rest.asked + ahead


def catch_up_after(rest: EpochRest, ahead: int, serial: int) -> CatchUp:
    """The fetches workers owe the epoch ``rest`` left, as torch's workers made them.

    Example:
        >>> from pipeloom.compat._iterator import EpochRest
        >>> from pipeloom.compat._plan import EpochPlan, PlanEntries
        >>> plan = EpochPlan(PlanEntries.from_outputs([[5], [3], [9], [1], [7]]), base_seed=0)
        >>> catch_up_after(EpochRest(plan, 1, False, 2, None), ahead=2, serial=4).entries
        ((1, [3]), (2, [9]))
    """
    plan = rest.plan
    if rest.iterable:
        per_worker = ahead // max(1, rest.workers)
        delivered = plan.outputs or (0,) * rest.workers
        return CatchUp(serial, outputs=tuple(d + per_worker for d in delivered))
    end = min(torch_requests(rest, ahead), plan.first + len(plan.entries))
    entries = tuple(
        (p, plan.entries[p - plan.first])
        for p in range(plan.first + rest.delivered, end)
        if p not in plan.skip
    )
    return CatchUp(serial, entries=entries)
