"""``shutdown()`` from another thread while ``next(loader)`` waits for an item.

The training loop's ``next()`` holds the loader's step (see ``_steps.py``)
while it waits; a stuck worker never wakes it, so a ``shutdown()`` from a
watchdog thread that waited for the step to end would wait forever. Instead
it wakes that wait (``pipeloom.datapipes.runtime.interrupt_waits``), in
whichever thread holds the loader (``StepGate.waking``: the training loop's
``next()``, a ``state_dict()`` from a third thread, a replay inside
``iter()``): the waiting thread keeps the position -- a wait for the loader's next item is
between two items, so the checkpoint is exact -- and its ``next()`` raises
``LoaderShutDown`` at once; the shutting-down thread then stops the workers.
A ``next()`` running code of a block in its own thread cannot be woken: after
``STEP_END_WAIT_S`` the loader stops as that code returns, with no exact
position.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._steps import StepGate
from .errors import LoaderShutDown, StateError

__all__ = ["STEP_END_WAIT_S", "StepStopped", "stop_the_step"]

#: How long ``shutdown()`` from another thread waits for a ``next()`` there to end
#: (at once when it waits for an item; code of a block running in it may take longer).
STEP_END_WAIT_S = 2.0


@dataclass
class StepStopped:
    """What :func:`stop_the_step` found.

    Attributes:
        ended: no step holds the loader now (False: it runs on; the loader
            stops when it returns, and ``why`` says there is no exact position).
        state: the position kept by an interrupted wait (None: none was interrupted).
        error: why an interrupted wait kept no position.
        why: set when ``ended`` is False.
    """

    ended: bool = True
    state: dict[str, Any] | None = None
    error: StateError | None = None
    why: str = ""


def stop_the_step(
    steps: StepGate, where: Callable[[], str | None], take_state: Callable[[], dict[str, Any]]
) -> StepStopped:
    """From a thread outside the step: end a step another thread is in.

    ``where()`` names what that ``next()`` waits for ("batch 3 of epoch 0"),
    None when no epoch runs; ``take_state()`` is the loader's checkpoint,
    called in the waiting thread.
    """
    outcome = StepStopped()
    if steps.lock.acquire(blocking=False):  # no step in progress
        steps.lock.release()
        return outcome

    def on_interrupt(between_items: bool) -> BaseException | None:
        place = where()
        if place is None or not steps.inside_a_step():
            return None  # a wait of another loader in that thread: not ours
        if not between_items:
            outcome.error = StateError(
                f"shutdown() was called from another thread while next(loader) waited inside "
                f"a block, part-way through {place}: there is no exact position"
            )
        else:
            try:
                outcome.state = take_state()
            except StateError as error:
                outcome.error = error
        resume = "state_dict() resumes there" if between_items else "no exact position"
        return LoaderShutDown(
            f"shutdown() was called from another thread while next(loader) waited for "
            f"{place}; the loader is shut down ({resume})"
        )

    with steps.waking(on_interrupt):  # the thread holding the loader, whichever it is
        outcome.ended = steps.lock.acquire(timeout=STEP_END_WAIT_S)
    if outcome.ended:
        steps.lock.release()
    if not outcome.ended:
        outcome.why = (
            f"shutdown() was called from another thread while "
            f"next(loader) ran for more than {STEP_END_WAIT_S:g} s without waiting for an "
            f"item (code of a block running in that thread), so there is no exact position; "
            f"the workers stop when that next() returns"
        )
    return outcome
