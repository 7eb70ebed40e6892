"""Choosing a queue from where its two endpoints run."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeloom.queues._base import DataLoaderQueue
from pipeloom.queues._local import LocalQueue
from pipeloom.queues._process import ProcessQueue
from pipeloom.queues._thread import ThreadQueue

__all__ = ["Location", "make_queue"]

MAIN = "main"


@dataclasses.dataclass(frozen=True)
class Location:
    """Where one endpoint runs: a process label and a thread label.

    Labels are names the caller chooses; only equality matters. ``"main"`` as
    the process label means "the process that calls :func:`make_queue`".

    Args:
        process: e.g. ``"main"`` or ``"worker-3"``.
        thread: e.g. ``"main"`` or ``"prefetch"``.

    Example:
        >>> Location.parse("worker-1/io")
        Location(process='worker-1', thread='io')
    """

    process: str = MAIN
    thread: str = MAIN

    def __post_init__(self) -> None:
        for field in ("process", "thread"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value or "/" in value:
                raise ValueError(
                    f"Location.{field} must be a non-empty label without '/', got {value!r}"
                )

    @classmethod
    def parse(cls, text: str) -> Location:
        """``"process"`` or ``"process/thread"`` -> Location."""
        if not isinstance(text, str):
            raise TypeError(f"expected a Location or a 'process[/thread]' string, got {text!r}")
        process, _, thread = text.partition("/")
        return cls(process, thread or MAIN)

    def __str__(self) -> str:
        return f"{self.process}/{self.thread}"


def make_queue(
    producer: Location | str, consumer: Location | str, capacity: int = 2, **options: Any
) -> DataLoaderQueue:
    """The right queue for a producer at one location and a consumer at another.

    Same thread: :class:`LocalQueue`; same process: :class:`ThreadQueue`;
    different processes: :class:`ProcessQueue` (with ``owner`` set when one end
    is in ``"main"``, the calling process).

    Args:
        producer: where ``put`` is called (a Location or ``"process[/thread]"``).
        consumer: where ``get`` is called.
        capacity: the most items in flight.
        **options: passed to the chosen class (e.g. ``owner`` for processes).

    Example:
        >>> type(make_queue("worker-0", "main")).__name__
        'ProcessQueue'
        >>> type(make_queue("main", "main")).__name__
        'LocalQueue'
    """
    src = producer if isinstance(producer, Location) else Location.parse(producer)
    dst = consumer if isinstance(consumer, Location) else Location.parse(consumer)
    if src.process != dst.process:
        if "owner" not in options:
            options["owner"] = (
                "consumer" if dst.process == MAIN else "producer" if src.process == MAIN else None
            )
        return ProcessQueue(capacity, **options)
    if options:
        raise TypeError(f"unexpected options for an in-process queue: {sorted(options)}")
    if src.thread != dst.thread:
        return ThreadQueue(capacity)
    return LocalQueue(capacity)
