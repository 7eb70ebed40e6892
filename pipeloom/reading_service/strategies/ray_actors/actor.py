"""What runs inside one Ray actor: a classic worker whose epochs are streaming generators.

:class:`EpochActor` is a plain class (Ray is optional); ``pool.py`` turns it
into an actor class with ``ray.remote``. The actor holds its own copy of the
workers' part, keeps its shard at the sharding point, and answers one call per
epoch, :meth:`EpochActor.epoch`, a generator Ray streams back to the main
process (``num_returns="streaming"``): each object it yields is a *run*, a
list of the messages a classic worker sends (``(position, draws, item)``
outputs, then ``END`` or a ``Failure``).

The epoch itself is the classic worker's (``workers/epoch.py``'s
:func:`produce_epoch`), run in a thread that puts each message in a small
queue; the generator takes what is ready from it, up to ``run_length``
messages, and yields it as one object. Ray's backpressure (at most
``prefetch_factor`` objects not yet taken by the main process) stops the
generator at its ``yield``; the thread then stops at the full queue, so an
actor holds at most ``prefetch_factor`` runs in the object store plus one run
in its queue.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ....datapipes import DataPipe, IterDataPipe
from ....datapipes.runtime import NO_STAMP, key_position, restore_stamp
from ....errors import NotAvailable, QueueError
from ....queues import ThreadQueue
from ...planning.sharding import find_in_copy, keep_shard
from ...workers.epoch import produce_epoch
from ...workers.failure import Failure, capture_failure
from ...workers.info import WorkerInfo, set_process_worker_info
from ...workers.messages import END
from ...workers.process import Payload
from ...workers.rngs import seed_worker_rngs, worker_seed

__all__ = ["EpochActor", "Shard"]


class Shard:
    """Which shard actor ``index`` keeps: the sharding point's place in the part, and the deal.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> pipe = IterableWrapper(range(6)).sharding_filter().map(abs)
        >>> point = Shard(point_index=1, count=2, group_size=1, outer=(1, 0)).apply(pipe, 1)
        >>> list(pipe)
        [1, 3, 5]
    """

    def __init__(
        self, *, point_index: int, count: int, group_size: int, outer: tuple[int, int]
    ) -> None:
        self.point_index = point_index
        self.count = count
        self.group_size = group_size
        self.outer = outer

    def apply(self, pipe: DataPipe, index: int) -> DataPipe:
        """Make ``pipe``'s sharding point keep actor ``index``'s shard; return that point."""
        point = find_in_copy(pipe, self.point_index)
        keep_shard(
            point, workers=self.count, index=index, group_size=self.group_size, outer=self.outer
        )
        return point


class EpochActor:
    """One replica of the workers' part, run epoch after epoch in a Ray actor.

    Args:
        payload: the workers' part (pickled with cloudpickle).
        shard: which shard this actor keeps.
        index: this actor's index (``get_worker_info().id``).
        seed: the seed worker seeds derive from.
        run_length: the most messages in one yielded run.
        worker_init_fn: called as ``worker_init_fn(index)`` before the first epoch
            of each actor process (again after a restart).
    """

    def __init__(
        self,
        payload: Payload,
        shard: Shard,
        index: int,
        seed: int,
        run_length: int,
        worker_init_fn: Callable[[int], None] | None,
    ) -> None:
        restore_stamp(NO_STAMP)
        self.pipe: IterDataPipe = payload.load()
        self.point = shard.apply(self.pipe, index)
        self.index = index
        self.count = shard.count
        self.seed = seed
        self.run_length = run_length
        self.worker_init_fn = worker_init_fn
        self.initialized = False
        self.label = f"ray actor {index} (pid {os.getpid()}, host {socket.gethostname()})"

    def where(self) -> dict[str, Any]:
        """Where this actor runs: its pid, host, node address and Ray node id."""
        import ray  # this runs in a Ray actor, so Ray is there

        context = ray.get_runtime_context()
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "node_ip": ray.util.get_node_ip_address(),
            "node_id": context.get_node_id(),
            "actor_id": context.get_actor_id(),
        }

    def epoch(self, epoch: int, resume: int | None, skip: int) -> Iterator[list[Any]]:
        """Produce ``epoch`` as runs of messages (``resume``: from that position on).

        ``skip``: how many outputs at position ``resume`` the main process already
        has (a restarted actor replays from the last output it delivered).
        """
        own_seed = worker_seed(self.seed, epoch, self.index)
        seed_worker_rngs(own_seed)
        set_process_worker_info(WorkerInfo(self.index, self.count, own_seed, self.pipe))
        failure = self._initialize()
        if failure is not None:
            yield [failure]
            return
        queue = ThreadQueue(capacity=self.run_length)
        producer = threading.Thread(
            target=self._produce,
            args=(queue, epoch, resume),
            name=f"pipeloom-ray-actor-{self.index}",
            daemon=True,
        )
        producer.start()
        try:
            yield from _runs(queue, self.run_length, resume, skip)
        finally:  # also when the main process cancels the call (GeneratorExit)
            queue.close()  # the producer's next put fails, which ends it
            producer.join()

    def _produce(self, queue: ThreadQueue, epoch: int, resume: int | None) -> None:
        at = None if resume is None else (self.point, resume)
        produce_epoch(self.pipe, queue.put, epoch=epoch, worker_label=self.label, resume=at)

    def _initialize(self) -> Failure | None:
        if self.initialized:
            return None
        self.initialized = True
        if self.worker_init_fn is None:
            return None
        try:
            self.worker_init_fn(self.index)
        except Exception as error:  # noqa: BLE001 - surfaced in the main process
            return capture_failure(error, f"{self.label}, in worker_init_fn({self.index})")
        return None


def _runs(
    queue: ThreadQueue, run_length: int, resume: int | None, skip: int
) -> Iterator[list[Any]]:
    """The queue's messages in runs: each run is what was ready, up to ``run_length``.

    The first ``skip`` outputs at position ``resume`` are dropped (delivered before).
    """
    while True:
        try:
            run = [queue.get()]
        except QueueError:
            return  # the producer is gone without an END: the call was cancelled
        while len(run) < run_length and not _last(run[-1]):
            try:
                run.append(queue.get(block=False))
            except (NotAvailable, QueueError):
                break
        if skip:
            kept = []
            for message in run:
                if skip and not _last(message) and key_position(message[0]) == resume:
                    skip -= 1
                else:
                    kept.append(message)
            run = kept
        if run:
            yield run
        if run and _last(run[-1]):
            return


def _last(message: Any) -> bool:
    """True for the message that ends an epoch: ``END`` or a ``Failure``."""
    return message is END or isinstance(message, Failure)
