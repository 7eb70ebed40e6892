"""A queue between two processes: framed socket + shared memory for payloads.

See ``docs/queues.md`` for the protocol, the state diagram and cleanup rules.
"""

from __future__ import annotations

import functools
import math
import os
import socket
import threading
import weakref
from multiprocessing.reduction import DupFd
from typing import Any, Literal, cast

import torch

from pipeloom.errors import NotAvailable
from pipeloom.events import ReadinessSource
from pipeloom.queues._base import (
    DataLoaderQueue,
    Deadline,
    QueueClosed,
    QueueState,
    QueueStatistics,
    Role,
    validate_capacity,
)
from pipeloom.queues._consumer import EMPTY, ConsumerEnd
from pipeloom.queues._control import Control, Slot
from pipeloom.queues._producer import ProducerEnd
from pipeloom.queues._serialize import encode
from pipeloom.queues._wire import Kind, send_frame

__all__ = ["ALLOCATE_MIN", "ProcessQueue"]

_SOCKET_BUFFER = 1 << 20
ALLOCATE_MIN = 256 * 1024
"""Tensors from :meth:`ProcessQueue.empty_tensor` this big or bigger lie in shared memory."""
# Bumped in every forked child, so a queue notices a fork without a getpid()
# system call per operation.
_forks = [0]
os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))
_SLOT = {"producer": Slot.PRODUCER_PID, "consumer": Slot.CONSUMER_PID}
_CLOSED = {"producer": Slot.PRODUCER_CLOSED, "consumer": Slot.CONSUMER_CLOSED}
_OTHER: dict[Role, Role] = {"producer": "consumer", "consumer": "producer"}


class ProcessQueue(DataLoaderQueue):
    """A bounded queue between a producer process and a consumer process.

    Items are pickled (protocol 5; cloudpickle for lambdas and local
    functions). Tensors and arrays, also nested in dicts/lists/tuples, travel
    through pooled anonymous shared memory (memfd) -- one copy in, none out;
    the received tensor is a view of shared memory that stays valid while
    you hold it. Small items take a fast path through the socket.

    Hand the queue to the other process as a ``Process`` argument (any start
    method) or through ``fork``, *before* using it in the parent. Each end binds
    to the first process that uses it; a third process raises ``RuntimeError``.

    Args:
        capacity: the most items put and not yet got; ``put`` waits beyond it.
        owner: which end the creating process will use (``"producer"``,
            ``"consumer"``) or None. When set, the creating process drops its
            copy of the other end on first use, so the peer's death is seen
            even before the peer has used the queue.
        pool_bytes: the most bytes of free shared memory the producer keeps
            for reuse (None: up to ``capacity + 2`` segments, of all sizes). A
            small budget keeps idle memory low when items are large.

    Example:
        >>> import torch
        >>> with ProcessQueue(capacity=2) as q:   # both ends in one process here
        ...     q.put({"x": torch.ones(3)})
        ...     q.get()["x"].sum().item()
        3.0
    """

    kind = "process"

    def __init__(
        self,
        capacity: int = 2,
        *,
        owner: Literal["producer", "consumer"] | None = None,
        pool_bytes: int | None = None,
    ) -> None:
        if owner not in (None, "producer", "consumer"):
            raise ValueError(f"owner must be 'producer', 'consumer' or None, got {owner!r}")
        producer, consumer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for sock in (producer, consumer):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)
        self._pool_bytes = pool_bytes
        self._setup(
            validate_capacity(capacity),
            owner,
            os.getpid(),
            {"producer": producer, "consumer": consumer},
            Control(),
        )

    def _setup(
        self,
        capacity: int,
        owner: str | None,
        creator: int,
        socks: dict[Role, socket.socket | None],
        ctl: Control,
    ) -> None:
        self._capacity = capacity
        self._owner = owner
        self._creator = creator
        self._socks = socks
        self._ctl: Control | None = ctl
        self._closed_counts = [0] * 13  # the counters as they were when it was closed here
        self._reset_local_state()

    def _reset_local_state(self) -> None:
        """Per-process state; rebuilt in a forked child."""
        self._pid = os.getpid()
        self._fork_generation = _forks[0]
        self._producer: ProducerEnd | None = None
        self._consumer: ConsumerEnd | None = None
        self._put_lock = threading.Lock()
        self._get_lock = threading.Lock()
        self._bind_lock = threading.Lock()
        self._closed_here: str | None = None
        self._wake_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)

    def _after_fork(self) -> None:
        # The child inherited the parent's per-process state; none of it is ours.
        for end in (self._producer, self._consumer):
            if end is not None:
                end.close(send_close=False)  # closes inherited fd copies only
        os.close(self._wake_fd)
        self._reset_local_state()

    # -- binding ---------------------------------------------------------

    def _end(self, role: Role) -> Any:
        if self._fork_generation != _forks[0]:
            self._after_fork()
        end = self._producer if role == "producer" else self._consumer
        if end is not None:
            return end
        with self._bind_lock:  # two threads may both have seen no end: bind once
            end = self._producer if role == "producer" else self._consumer
            return end if end is not None else self._bind(role)

    def _bind(self, role: Role) -> Any:
        if self._closed_here is not None or self._ctl is None:
            raise QueueClosed(self._closed_here or "ProcessQueue was closed in this process")
        pid = os.getpid()
        holder = self._ctl.claim(_SLOT[role], pid)
        if holder != pid:
            verb = "put" if role == "producer" else "get"
            raise RuntimeError(
                f"ProcessQueue: the {role} end is bound to process {holder}, but process {pid} "
                f"called {verb}(); a queue joins exactly two endpoints, so give each "
                "producer/consumer pair its own queue"
            )
        sock = self._socks[role]
        if sock is None:
            raise RuntimeError(
                f"ProcessQueue: process {pid} has no {role} end (it was dropped here when this "
                f"process used the other end); hand the queue to other processes before using it"
            )
        end: Any
        if role == "producer":
            self._producer = end = ProducerEnd(
                sock, self._ctl, self._capacity, self._wake_fd, self._pool_bytes
            )
        else:
            self._consumer = end = ConsumerEnd(sock, self._ctl, self._capacity, self._wake_fd)
        # Weakly: an end that referred to its queue would make a reference cycle, and an
        # abandoned queue would keep its descriptors until a garbage collection.
        end.on_peer = functools.partial(_drop_unused_end, weakref.ref(self), _OTHER[role])
        other_pid = self._ctl[_SLOT[_OTHER[role]]]
        if (other_pid and other_pid != pid) or (self._owner == role and pid == self._creator):
            self._drop_end(_OTHER[role])
        return end

    def _drop_end(self, role: Role) -> None:
        """Close this process's copy of an end it will never use (so EOF works)."""
        in_use = self._producer if role == "producer" else self._consumer
        sock = self._socks[role]
        if in_use is None and sock is not None:
            self._socks[role] = None
            sock.close()

    # -- the queue protocol -----------------------------------------------

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def state(self) -> QueueState:
        ctl = self._ctl
        if self._closed_here is not None or ctl is None:
            return QueueState.CLOSED
        if ctl[Slot.PRODUCER_CLOSED] or ctl[Slot.CONSUMER_CLOSED]:
            return QueueState.CLOSED
        return QueueState.OPEN

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        deadline = Deadline(timeout)
        end: ProducerEnd = self._end("producer")
        stream, buffers = encode(item)
        with self._put_lock:
            end.put(stream, buffers, block, deadline)

    def wait_for_room(self, timeout: float | None = None) -> None:
        """Block until ``put`` would not wait: fewer than ``capacity`` items in flight.

        A producer that calls it before making its next item keeps at most
        ``capacity`` items alive, the one it is making included (torch's
        ``prefetch_factor`` counts that way). Binds the producer end.

        Raises:
            TimeoutError: ``timeout`` seconds passed first.
            QueueClosed, QueueBroken: as ``put`` would.
        """
        deadline = Deadline(timeout)
        end: ProducerEnd = self._end("producer")
        with self._put_lock:
            end.wait_for_room(True, deadline)

    def empty_tensor(
        self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """An uninitialised tensor in this queue's shared memory (producer side).

        Fill it and put it (alone or inside an item): it reaches the consumer
        without a copy, as torch's workers collate into shared memory. Call it
        in the producer process (it binds the producer end, like ``put``).
        The memory is reused once this process dropped every view of the
        tensor and the consumer dropped everything built from it; mutate it
        only before putting it. Small tensors (under :data:`ALLOCATE_MIN`
        bytes, which travel in the message itself) are plain ``torch.empty``.

        Example:
            >>> q = ProcessQueue(capacity=2)
            >>> batch = q.empty_tensor((16, 3, 224, 224), torch.uint8)
            >>> torch.stack([torch.zeros(3, 224, 224, dtype=torch.uint8)] * 16, out=batch).shape
            torch.Size([16, 3, 224, 224])
            >>> q.close()
        """
        shape = tuple(shape)
        numel = math.prod(shape)
        nbytes = numel * dtype.itemsize
        if nbytes < ALLOCATE_MIN:
            return torch.empty(shape, dtype=dtype)
        end: ProducerEnd = self._end("producer")
        with self._put_lock:
            raw = end.allocate(nbytes)
        return torch.from_numpy(raw).view(dtype).view(shape)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        deadline = Deadline(timeout)
        end: ConsumerEnd = self._end("consumer")
        with self._get_lock:
            try:
                item = end.get(block, deadline)
            except BaseException as error:  # Ctrl-C: resumed exactly, or the queue is broken
                end.get_interrupted(error)
                raise
        if item is EMPTY:
            raise NotAvailable("ProcessQueue is empty")
        return item

    def reclaim(self) -> None:
        """Take back the shared memory the consumer is done with (``put`` does it too).

        A producer with nothing to send calls it when :meth:`space_readiness`
        fires, so freed segments are retired (or pooled) at once instead of at
        the next ``put``. Does nothing in a process that has not put yet.
        """
        if self._fork_generation != _forks[0]:
            self._after_fork()
        producer = self._producer
        if producer is not None and self._closed_here is None:
            with self._put_lock:
                producer.drain_returns()

    def trim(self, min_size: int = 1 << 20) -> None:
        """Give back the memory of free pooled segments of ``min_size`` bytes or more.

        The producer keeps segments the consumer freed, to reuse their warm
        pages; a producer about to idle calls this so that many idle producers
        do not each hold big segments (the next put makes a fresh one). Does
        nothing in a process that has not put yet.
        """
        if self._fork_generation != _forks[0]:
            self._after_fork()
        producer = self._producer
        if producer is not None and self._closed_here is None:
            with self._put_lock:
                producer.trim(min_size)

    def readiness(self) -> ReadinessSource:
        """Readable fds (socket, close wake-up, producer pidfd); binds the consumer end."""
        return self._end("consumer").readiness

    def space_readiness(self) -> ReadinessSource:
        """Readable when the consumer made room or went away; binds the producer end."""
        return self._end("producer").readiness

    def qsize(self) -> int:
        ctl = self._ctl
        return 0 if ctl is None else ctl[Slot.PUTS] - ctl[Slot.GETS]

    def statistics(self) -> QueueStatistics:
        ctl = self._ctl
        values = list(self._closed_counts) if ctl is None else list(ctl.slots[:13])
        return QueueStatistics(
            kind=self.kind,
            state=self.state.value,
            qsize=values[Slot.PUTS] - values[Slot.GETS],
            capacity=self._capacity,
            puts=values[Slot.PUTS],
            gets=values[Slot.GETS],
            bytes_via_shm=values[Slot.BYTES_VIA_SHM],
            segments_created=values[Slot.SEGMENTS_CREATED],
            segments_reused=values[Slot.SEGMENTS_REUSED],
            bytes_inline=values[Slot.BYTES_INLINE],
            shm_bytes_held=values[Slot.SHM_BYTES_HELD],
            bytes_uncopied=values[Slot.BYTES_UNCOPIED],
        )

    # -- lifecycle --------------------------------------------------------

    def close(self) -> None:
        """Close this process's ends; idempotent. The peer sees ``QueueClosed``.

        A consumer's ``get`` still returns what was put before a producer's
        close. Shared memory held by received tensors stays valid; everything
        else is released here (and by the kernel, whatever happens).
        """
        if self._fork_generation != _forks[0]:
            self._after_fork()
        if self._closed_here is not None:
            return
        self._closed_here = f"ProcessQueue was closed by process {os.getpid()}"
        for end in (self._producer, self._consumer):
            if end is not None:
                end.closed_here = self._closed_here
        os.eventfd_write(self._wake_fd, 1)  # wake calls blocked in other threads
        with self._put_lock, self._get_lock, self._bind_lock:
            self._release()

    def _release(self) -> None:
        for end in (self._producer, self._consumer):
            if end is not None:
                end.close(send_close=True)
        self._announce_unused_owner_close()
        for role, sock in self._socks.items():
            if sock is not None:
                sock.close()
            self._socks[role] = None
        if self._ctl is not None:
            # What crossed it stays readable (statistics of a finished epoch's queue).
            self._closed_counts = list(self._ctl.slots[:13])
            self._ctl.close()
            self._ctl = None
        os.close(self._wake_fd)

    def _announce_unused_owner_close(self) -> None:
        """Closing the owner's end before ever using it still tells the peer (a worker
        blocked in ``put`` for room): it would otherwise never see end-of-file, since
        it (and its forked siblings) hold copies of the owner's socket."""
        role, ctl = cast("Role | None", self._owner), self._ctl
        if role is None or ctl is None or self._pid != self._creator:
            return
        sock = self._socks[role]
        used = self._producer if role == "producer" else self._consumer
        if used is not None or sock is None or ctl[_SLOT[role]] != 0:
            return  # closed as a used end, or the end went to another process
        ctl[_CLOSED[role]] = 1
        try:
            send_frame(sock, Kind.CLOSE)
        except OSError:
            pass

    def __del__(self) -> None:
        if (
            getattr(self, "_closed_here", "") is None
            and getattr(self, "_fork_generation", -1) == _forks[0]
        ):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - never raise from a finalizer
                pass

    # -- crossing process boundaries ---------------------------------------

    def __reduce__(self) -> Any:
        if self._fork_generation != _forks[0]:
            self._after_fork()
        if self._closed_here is not None or self._ctl is None:
            raise RuntimeError("a closed ProcessQueue cannot be sent to another process")
        if self._producer is not None or self._consumer is not None:
            raise RuntimeError(
                "ProcessQueue: this process already uses the queue, so it cannot hand it to "
                "another process; pass the queue to the child (Process args) before the "
                "parent's first put()/get()"
            )
        socks = {role: None if s is None else DupFd(s.fileno()) for role, s in self._socks.items()}
        return _rebuild, (
            self._capacity,
            self._pool_bytes,
            self._owner,
            self._creator,
            socks["producer"],
            socks["consumer"],
            DupFd(self._ctl.fd),
        )


def _drop_unused_end(queue: weakref.ref[ProcessQueue], role: Role, peer_pid: int) -> None:
    alive = queue()
    if alive is not None:
        alive._drop_end(role)  # noqa: SLF001 - the queue's own callback


def _rebuild(
    capacity: int,
    pool_bytes: int | None,
    owner: str | None,
    creator: int,
    producer: Any,
    consumer: Any,
    ctl: Any,
) -> ProcessQueue:
    queue = ProcessQueue.__new__(ProcessQueue)
    queue._pool_bytes = pool_bytes
    socks: dict[Role, socket.socket | None] = {
        "producer": None if producer is None else socket.socket(fileno=producer.detach()),
        "consumer": None if consumer is None else socket.socket(fileno=consumer.detach()),
    }
    queue._setup(capacity, owner, creator, socks, Control(ctl.detach()))
    return queue
