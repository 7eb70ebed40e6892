"""Ranks of a job as threads of this process: fast, and a hang fails in seconds.

Each rank's ``DistributedReadingService`` gets a :class:`ThreadJob` instead of a
gloo group: the service's own code runs, and only the collectives it uses
(``broadcast_object_list``, ``all_gather``, ``all_reduce``, ``all_gather_object``)
go through :class:`World`, which exchanges values between the rank threads. A rank that
leaves (returns or raises) is like a rank that exited: a collective it never
joined fails on the others at once, as gloo's closed connection does, and
otherwise after ``timeout`` seconds. Real gloo ranks are in
``distributed_ranks.py`` (spawned processes: slower, the same service code).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from pipeloom.reading_service import DistributedReadingService, SequentialReadingService
from pipeloom.reading_service.distributed.job import Job


class World:
    """The ranks' meeting point: round ``k`` of a rank meets round ``k`` of the others."""

    def __init__(self, size: int, timeout: float) -> None:
        self.size = size
        self.timeout = timeout
        self._changed = threading.Condition()
        self._rounds: dict[int, dict[int, Any]] = {}
        self._next_round = [0] * size
        self._gone: set[int] = set()

    def exchange(self, rank: int, value: Any) -> list[Any]:
        """Every rank's ``value`` of this round, by rank (``RuntimeError`` if one never comes)."""
        with self._changed:
            number = self._next_round[rank]
            self._next_round[rank] += 1
            values = self._rounds.setdefault(number, {})
            values[rank] = value
            self._changed.notify_all()
            self._changed.wait_for(
                lambda: len(values) == self.size or bool(self._gone - set(values)), self.timeout
            )
            if len(values) < self.size:
                missing = sorted(set(range(self.size)) - set(values))
                raise RuntimeError(f"collective {number}: ranks {missing} never came")
            return [values[r] for r in range(self.size)]

    def rounds(self, rank: int) -> int:
        """How many collectives ``rank`` joined."""
        with self._changed:
            return self._next_round[rank]

    def leave(self, rank: int) -> None:
        with self._changed:
            self._gone.add(rank)
            self._changed.notify_all()


class ThreadJob(Job):
    """A :class:`Job` whose collectives meet the other rank threads in ``group`` (a World)."""

    def _call(self, what: str, collective: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        world, rank = self.group, self.rank

        def broadcast(box, group, group_src):
            box[0] = world.exchange(rank, box[0])[group_src]

        def gather(rows, mine, group):
            for row, value in zip(rows, world.exchange(rank, mine.clone())):
                row.copy_(value)

        def reduce(tensor, group):
            tensor.copy_(sum(world.exchange(rank, tensor.clone())))

        def gather_objects(values, value, group):
            values[:] = world.exchange(rank, value)

        local = {
            dist.broadcast_object_list: broadcast,
            dist.all_gather: gather,
            dist.all_reduce: reduce,
            dist.all_gather_object: gather_objects,
        }
        super()._call(what, local[collective], *args, **kwargs)


def rank_service(world: World, rank: int, *args: Any, inner: Any = None, **kwargs: Any) -> Any:
    """``DistributedReadingService(*args, **kwargs)`` as rank ``rank`` of ``world``,
    followed by ``inner()`` when given (e.g. ``lambda: ThreadReadingService(2)``)."""
    service = DistributedReadingService(*args, timeout=world.timeout, **kwargs)
    group = world if world.size > 1 else None
    service._job = ThreadJob(rank, world.size, group, world.timeout)
    return service if inner is None else SequentialReadingService(service, inner())


def run_ranks(size: int, body: Callable[[World, int], Any], timeout: float = 10.0) -> list:
    """Run ``body(world, rank)`` on ``size`` rank threads; each rank's ``("ok", result)``
    or ``("error", type name, message)``. Fails if a rank is still running after
    twice ``timeout`` (a hang)."""
    world = World(size, timeout)
    results: list[Any] = [None] * size

    def main(rank: int) -> None:
        try:
            results[rank] = ("ok", body(world, rank))
        except Exception as error:  # noqa: BLE001 - the test inspects it
            results[rank] = ("error", type(error).__name__, str(error))
        finally:
            world.leave(rank)

    threads = [threading.Thread(target=main, args=(r,), daemon=True) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * timeout)
    hung = [rank for rank, thread in enumerate(threads) if thread.is_alive()]
    assert not hung, f"ranks {hung} still running after {2 * timeout:g} s"
    return results


def ok(results: list) -> list:
    """The ranks' results, asserting that none raised."""
    for rank, result in enumerate(results):
        assert result[0] == "ok", f"rank {rank}: {result}"
    return [result[1] for result in results]
