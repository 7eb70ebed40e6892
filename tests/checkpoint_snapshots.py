"""A thread that takes a checkpoint racing each next step of the iterating thread."""

from __future__ import annotations

import queue
import random
import threading
from typing import Any


class Snapshotter:
    """Take ``loader.state_dict()`` in another thread, once per delivered item.

    After each item the iterating thread calls :meth:`race_the_next_step`: it
    wakes the snapshot thread and waits only until that thread is about to
    call ``state_dict()``, then goes on with its next step, so each snapshot
    lands anywhere in or around that step: before calling ``state_dict()``
    the snapshot thread also runs a loop of a random length up to ``jitter``
    iterations (work, not a sleep), so the landing points spread over the step.
    Each snapshot is kept as ``(items received before, state, items received after)``.
    """

    def __init__(self, loader: Any, received: list, jitter: int = 2000) -> None:
        self.loader = loader
        self.received = received
        self.jitter = jitter
        self._rng = random.Random(0)
        self.snapshots: list[tuple[int, dict, int]] = []
        self._tokens: queue.Queue = queue.Queue()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="snapshotter")

    def __enter__(self) -> Snapshotter:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._tokens.put(None)
        self._thread.join(timeout=60)

    def race_the_next_step(self) -> None:
        self._tokens.put(len(self.received))
        if not self._started.wait(timeout=60):
            raise TimeoutError("the snapshot thread did not start its state_dict()")
        self._started.clear()

    def _run(self) -> None:
        while self._tokens.get() is not None:
            before = len(self.received)
            self._started.set()
            for _ in range(self._rng.randrange(self.jitter)):
                pass
            state = self.loader.state_dict()
            self.snapshots.append((before, state, len(self.received)))
