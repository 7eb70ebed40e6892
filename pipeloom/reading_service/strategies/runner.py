"""The interface every reading service delegates to: one runner per planned pipeline.

A service validates its arguments, plans the pipeline once
(``planning/planner.py``) and hands the plan to the runner of its strategy;
from then on each service method is one call on the runner::

    runner = SomeRunner(pipeline, plan, ...)   # at initialize
    items = runner.start_epoch(epoch, state)   # each epoch (state: resume)
    runner.state_dict()                        # a checkpoint of the running epoch
    runner.shutdown()                          # stop every thread and process
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

from ...datapipes import BlockingReader, IterDataPipe
from ...errors import LoaderShutDown, WorkerTimeout
from ...graph import Plan

__all__ = ["Runner", "close_items", "drain", "primed"]


class Runner(abc.ABC):
    """Runs the epochs of one planned pipeline.

    Attributes:
        pipeline: the pipeline as the loader holds it (seeded).
        plan: the planner's decisions for it.
    """

    def __init__(self, pipeline: IterDataPipe, plan: Plan) -> None:
        self.pipeline = pipeline
        self.plan = plan

    @abc.abstractmethod
    def start_epoch(self, epoch: int, state: dict[str, Any] | None) -> Iterator[Any]:
        """Start ``epoch`` (resuming from ``state`` if given); its items."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The running epoch's state, enough for ``start_epoch(epoch, state)`` to resume."""

    def shutdown(self) -> None:  # noqa: B027 - optional: nothing to stop by default
        """Stop every thread and process the runner started; idempotent."""

    def queues(self) -> Sequence[tuple[str, Any]]:
        """The queues of the running epoch, labelled (see ``ReadingService.queues``)."""
        return ()


def primed(items: Generator[Any, None, None]) -> Generator[Any, None, None]:
    """``items`` started: a generator whose first ``yield`` comes before its ``try``, so
    that closing it before its first item still runs its ``finally`` (as ``drain``'s)."""
    next(items)
    return items


def close_items(items: Iterator[Any]) -> None:
    """Close ``items`` where it can be closed (a generator: its epoch's work stops)."""
    close = getattr(items, "close", None)
    if close is not None:
        close()


def drain(
    pipeline: IterDataPipe,
    on_close: Callable[[bool], None] | None = None,
    timeout: float | None = None,
) -> Generator[Any, None, None]:
    """Yield a pipeline's items, waiting on its readiness events.

    ``on_close(finished)`` runs when the generator ends: ``finished`` is True
    after the last item, False when the consumer stopped early or it raised;
    not when a ``shutdown()`` from another thread stopped the wait
    (``LoaderShutDown``): that thread stops the workers, and this one's
    ``next()`` raises at once instead of waiting for a stuck worker to stop.
    Closing it before its first item runs ``on_close(False)`` too, so the
    workers stop (persistent ones end the epoch) at once.
    """
    items = _drain(pipeline, on_close, timeout)
    next(items)  # into the try below: from here on, close() runs its finally
    return items


def _drain(
    pipeline: IterDataPipe,
    on_close: Callable[[bool], None] | None,
    timeout: float | None,
) -> Generator[Any, None, None]:
    reader = BlockingReader(pipeline, between_items=True)
    finished = shut_down = False
    try:
        yield None  # taken by drain()
        while True:
            try:
                item = reader.next(timeout)
            except StopIteration:
                finished = True
                return
            except TimeoutError:
                raise WorkerTimeout(
                    f"nothing arrived from the workers within timeout={timeout} s: a worker is "
                    f"stuck (on a network read, a lock, a deadlock in a library) or its next "
                    f"output takes longer than that. Raise timeout=, or find where it waits: "
                    f"run the pipeline in the main process (num_workers=0, or no reading "
                    f"service), where Ctrl-C shows the line"
                ) from None
            except LoaderShutDown:
                shut_down = True
                raise
            yield item
    finally:
        reader.close()
        if on_close is not None and not shut_down:
            on_close(finished)
