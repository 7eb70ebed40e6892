"""``DataLoader``: runs a pipeline, one epoch per ``iter()``, on a reading service."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any
from weakref import WeakMethod

import torch

from ._epoch import Epoch, EpochIterator
from ._fingerprint import (
    data_differences,
    data_fingerprint,
    fingerprint_differences,
    pipeline_fingerprint,
    unchecked_data,
)
from ._loader_state import (
    STATE_VERSION,
    UNCHECKED_VERSION,
    no_replay_in_arrival_order,
    read_state,
)
from ._owners import claim
from ._remote_shutdown import stop_the_step
from ._shutdown import ShutsDown, Steps
from ._steps import StepGate
from ._validate import check_bool, check_int
from ._walk import walk_upstream
from .autotune import as_reading_service, tuned_in
from .datapipes import IterDataPipe, MapDataPipe, MapToIter, as_datapipe, seed_pipeline
from .datapipes.runtime import check_declared_inputs, forget_shards
from .errors import StateError, StateOfAnotherService
from .graph import Placement
from .reading_service import ReadingService
from .stats import LoaderStats
from .stats.counters import LoaderCounters, assemble

__all__ = ["DataLoader"]

STATS_BY_DEFAULT = False  # see docs/performance.md, "Where the time goes": the measured cost


class DataLoader(ShutsDown):
    """Iterate a pipeline epoch after epoch, wherever its reading service runs it.

    Args:
        datapipe: the pipeline's last block (a torch ``Dataset``, a sequence or
            an iterable is wrapped; a map-style pipeline is read in index order).
        reading_service: where the blocks run; ``InProcessReadingService()``
            (the calling thread) by default; ``"auto"``: an
            ``AutoReadingService()`` that picks threads or processes, their
            count and prefetch while it runs (``pipeloom.autotune``).
        seed: makes every random block reproducible. ``None`` draws one seed
            from torch's default generator, so ``torch.manual_seed`` applies.
        resume_by_replay: when a block cannot save its state, ``state_dict()``
            raises naming it; with True it records instead how many items of
            the epoch were delivered, and a resumed loader re-reads and drops
            them (exact, but as slow as reading them again).
        stats: collect statistics for :meth:`stats` (a sampling thread, and
            each ``next()`` timed). ``None``: ``STATS_BY_DEFAULT`` (off).

    Each ``iter(loader)`` is a new epoch (0, 1, 2, ...); ``set_epoch(n)`` picks
    the next one. With the same seed and epoch the items and their order are
    the same on every run and with every reading service.

    ``state_dict()`` may be called between two items from any thread, and
    after ``shutdown()``; see ``docs/checkpointing.md`` for what it promises.

    Example:
        >>> from pipeloom.datapipes import IterableWrapper
        >>> pipe = IterableWrapper(range(6)).shuffle().batch(3)
        >>> with DataLoader(pipe, seed=0) as loader:
        ...     first = list(loader)
        ...     loader.set_epoch(0)
        ...     first == list(loader)
        True
    """

    def __init__(
        self,
        datapipe: Any,
        reading_service: ReadingService | str | None = None,
        *,
        seed: int | None = None,
        resume_by_replay: bool = False,
        stats: bool | None = None,
    ) -> None:
        pipeline = as_datapipe(datapipe)
        if isinstance(pipeline, MapDataPipe):
            pipeline = MapToIter(pipeline)
        assert isinstance(pipeline, IterDataPipe)
        check_declared_inputs(pipeline)
        reading_service = as_reading_service(reading_service)
        if seed is None:
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
        else:
            check_int("seed", seed, allow_none=True)
        seed = reading_service.agree_seed(seed)  # e.g. every rank takes rank 0's seed
        seed_pipeline(pipeline, seed)
        reading_service.check(pipeline)  # a pipeline it cannot run is refused here
        self.datapipe: IterDataPipe = pipeline
        self.reading_service = reading_service
        self.seed = seed
        self.resume_by_replay = check_bool("resume_by_replay", resume_by_replay)
        self._next_epoch = 0
        self._initialized = False
        self._closed = False
        self._current: Epoch | None = None  # the running epoch (its iterator holds it too)
        self._resume: dict[str, Any] | None = None
        self._resume_delivered = 0
        self._fingerprint = pipeline_fingerprint(pipeline)
        # One step at a time: an item and its count, a checkpoint, a new epoch or a
        # shutdown, so a state is always taken between two items.
        self._steps = StepGate()
        self._final_state: dict[str, Any] | None = None  # taken by shutdown() mid-epoch
        self._final_error: StateError | None = None  # why shutdown() could not take it
        collect = STATS_BY_DEFAULT if stats is None else check_bool("stats", stats)
        self._counters = LoaderCounters() if collect else None
        self._taken: str | None = None  # why it may not run: a newer loader took its blocks
        claim(self, walk_upstream(pipeline))

    # -- iteration -----------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        with self._steps.between():
            if self._closed:
                raise RuntimeError(
                    "this DataLoader was shut down; create a new one to iterate again"
                )
            if self._taken is not None:
                raise RuntimeError(self._taken)
            self._ensure_initialized()
            if self._current is not None:
                self._current.invalidate()
                self._current = None
            epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
            resume, self._resume = self._resume, None
            delivered, self._resume_delivered = self._resume_delivered, 0
            replayed = 0
            if resume is not None and resume["kind"] == "replay":
                replayed, delivered, resume = delivered, 0, None
            try:
                with self._exporting_stats():
                    try:
                        items = self.reading_service.start_epoch(epoch, resume)
                    except StateOfAnotherService as error:  # portable: replay what was delivered
                        if delivered and self.reading_service.delivers_in_arrival_order:
                            self._resume, self._resume_delivered = resume, delivered
                            raise no_replay_in_arrival_order(delivered) from error
                        items = self.reading_service.start_epoch(epoch, None)
                        replayed, delivered = delivered, 0
            except BaseException:
                self._next_epoch = epoch  # a retry starts this epoch afresh
                raise
            if self._counters is not None:
                items = self._counters.watch(items, self.reading_service)
            self._current = Epoch(epoch, items, delivered)
            iterator = EpochIterator(self, self._current, self._steps)
            with nullcontext() if self._counters is None else self._counters.replaying():
                for _ in range(replayed):  # re-read and drop what was delivered before
                    next(iterator, None)
            return iterator

    def end_epoch(self) -> None:
        """Stop the running epoch's work now, as the next ``iter()`` would first.

        Its iterator refuses further items; worker processes stop, or, if
        persistent, finish the epoch early and wait for the next. Nothing
        happens between epochs. The next ``iter()`` runs the epoch after it.

        Example:
            >>> from pipeloom.datapipes import IterableWrapper
            >>> loader = DataLoader(IterableWrapper(range(4)))
            >>> epoch = iter(loader); first = next(epoch)
            >>> loader.end_epoch()
            >>> next(epoch, "refused")
            Traceback (most recent call last):
            ...
            RuntimeError: ...
        """
        with self._steps.between():
            if self._current is not None:
                self._current.invalidate()
                self._current = None

    def __len__(self) -> int:
        """Items per epoch, when the pipeline knows it (else ``TypeError``)."""
        return len(self.datapipe)

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` run epoch ``epoch`` (after ``load_state_dict``: its own)."""
        epoch = check_int("epoch", epoch, minimum=0)
        if epoch != self._next_epoch and (self._resume is not None or self._resume_delivered):
            raise ValueError(
                f"the loaded state resumes epoch {self._next_epoch} after "
                f"{self._resume_delivered} items; set_epoch({epoch}) would drop that. Call "
                f"set_epoch({self._next_epoch}) (or nothing) to finish it, or skip load_state_dict"
            )
        self._next_epoch = epoch

    @property
    def epoch(self) -> int:
        """The epoch being iterated (or the next one, between epochs)."""
        return self._current.epoch if self._current is not None else self._next_epoch

    @property
    def next_epoch(self) -> int:
        """The epoch the next ``iter()`` runs (after an abandoned one: the one after it)."""
        return self._next_epoch

    def placement(self) -> Placement:
        """Which block runs where; ``print()`` it or call ``.to_dot()``."""
        self._ensure_initialized()
        return self.reading_service.placement()

    def stats(self) -> LoaderStats:
        """Where the time went so far: throughput, wait per stage, readiness, a verdict.

        Needs ``DataLoader(..., stats=True)``; see ``pipeloom.stats``. Under a
        ``DistributedReadingService`` every rank must call it (it gathers each
        rank's figures and flags the straggler).
        """
        if self._counters is None:
            raise RuntimeError(
                "this DataLoader collects no statistics; create it with "
                "DataLoader(..., stats=True) to call stats()"
            )
        return assemble(self._counters, self.reading_service, self.placement(), self)

    # -- checkpoints ------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A plain, picklable snapshot; ``load_state_dict`` on a new loader resumes here.

        Taken between two items: from another thread it waits for the item in
        progress. ``state["delivered"]`` counts the epoch's items delivered
        before it. After ``shutdown()`` it is the position where the loader
        stopped (the next epoch's start if the epoch had ended).

        Raises:
            StateError: a block cannot save its state (see ``resume_by_replay``),
                the call comes from inside a step of this loader (e.g. a signal
                handler that interrupted ``next()``), or an exception escaped
                ``next()`` mid-item, so no exact position exists.
        """
        self._steps.refuse_inside_a_step("state_dict()")
        with self._steps.between():
            if self._final_error is not None:
                raise StateError(str(self._final_error)) from self._final_error
            if self._closed and self._final_state is not None:
                return self._final_state
            return self._take_state()

    def load_state_dict(self, state: dict[str, Any], *, strict: bool = True) -> None:
        """Resume from :meth:`state_dict`: the next ``iter()`` continues that epoch.

        Args:
            state: what ``state_dict()`` returned (also after ``torch.save``/``load``).
            strict: refuse a state saved from a different pipeline or dataset
                (its fingerprint: block types, their arguments, source lengths).
                ``False`` loads it anyway, for a change you know is harmless
                (e.g. the same files under a new root); positions then refer to
                the new pipeline's items. Strict, a state taken inside an epoch
                is also checked against the files it points into (listings,
                sizes and times: docs/storage.md); where a block's files cannot
                be checked (``list_files`` over roots a block makes), it warns.

        Raises:
            StateError: the state is not a DataLoader state, a field is damaged,
                or (``strict``) it was saved from another pipeline; the message
                says what differs.
        """
        check_bool("strict", strict)
        self._steps.refuse_inside_a_step("load_state_dict()")
        with self._steps.between():
            if self._closed:
                raise RuntimeError(
                    "this DataLoader was shut down; load the state into a new DataLoader"
                )
            seed, epoch, delivered, service = read_state(state)
            replay = service is not None and service["kind"] == "replay"
            if replay and delivered and self.reading_service.delivers_in_arrival_order:
                raise no_replay_in_arrival_order(delivered)
            if strict:
                self._check_fingerprint(state)
            for block in walk_upstream(self.datapipe):  # e.g. an opener re-opening a file
                if callable(set_strict := getattr(block, "set_strict_resume", None)):
                    set_strict(strict)
            if "autotune" in state and (tuned := tuned_in(self.reading_service)) is not None:
                tuned.load_tuning_state(state["autotune"])
            self.seed = self.reading_service.agree_seed(seed)
            seed_pipeline(self.datapipe, self.seed)
            self._next_epoch = epoch
            self._resume, self._resume_delivered = service, delivered
            if self._current is not None:
                self._current.invalidate()
                self._current = None

    def _take_state(self) -> dict[str, Any]:
        """The state now (the caller holds the step lock)."""
        current = self._current
        # Not started: the next epoch's start, or the loaded state the next iter() resumes.
        epoch, delivered, service_state = self._next_epoch, self._resume_delivered, self._resume
        if current is not None:
            if current.stopped_by is not None:
                raise StateError(
                    f"no exact position to save: {current.stopped_by} escaped next(loader) "
                    f"while epoch {current.epoch} was producing item {current.delivered}, so "
                    f"the pipeline may hold part of that item. Save checkpoints between steps "
                    f"(e.g. a signal handler sets a flag and the training loop saves before its "
                    f"next step), and resume from the last one"
                )
            epoch, delivered = current.epoch, current.delivered
            try:
                service_state = self.reading_service.state_dict()
            except StateError as error:
                if not self.resume_by_replay:
                    raise
                if self.reading_service.delivers_in_arrival_order:
                    raise StateError(
                        f"{error}. resume_by_replay=True cannot stand in: with in_order=False "
                        f"items come in arrival order, so a count of the items delivered "
                        f"does not say which they were; use in_order=True to checkpoint"
                    ) from error
                service_state = {"kind": "replay", "delivered": delivered}
        state = {
            "version": STATE_VERSION,
            "seed": self.seed,
            "epoch": epoch,
            "delivered": delivered,
            "service": service_state,
            "fingerprint": {
                "blocks": [[k, dict(f)] for k, f in self._fingerprint["blocks"]],
                # e.g. the files listed: checked on load when a position points into them
                "data": [] if service_state is None else data_fingerprint(self.datapipe),
            },
        }
        if (tuned := tuned_in(self.reading_service)) is not None:  # a resumed job starts tuned
            state["autotune"] = tuned.tuning_state()
        return state

    def _check_fingerprint(self, state: dict[str, Any]) -> None:
        if state["version"] == UNCHECKED_VERSION:
            warnings.warn(
                "this DataLoader state was saved by an older pipeloom (state version 1), which "
                "did not record the pipeline's fingerprint, so it is loaded without checking "
                "that it comes from this pipeline and dataset; a state saved now carries the "
                "check (pass strict=False to load old states without this warning)",
                UserWarning,
                stacklevel=3,
            )
            return
        saved = state.get("fingerprint")
        differences = fingerprint_differences(saved, self._fingerprint)
        if differences:
            raise StateError(
                "this state was saved from a different pipeline or dataset, so its positions "
                "would point at other items:\n  "
                + "\n  ".join(differences)
                + "\nBuild the loader as it was built when the state was saved; if the change "
                "is intended (e.g. the same files under a new root), load it with "
                "load_state_dict(state, strict=False)"
            )
        if state.get("service") is None:  # between epochs: no position points into the data
            return
        data = saved.get("data") if isinstance(saved, dict) else None
        changed = data_differences(data, self.datapipe)
        if changed:
            raise StateError(
                "the files changed since this state was saved, so its positions would point "
                "at other files or other samples, and the resumed epoch would skip, repeat "
                "or mix samples:\n  "
                + "\n  ".join(changed)
                + f"\nRestore the files as they were when the state was saved; or start epoch "
                f"{state['epoch']} over without this state (DataLoader(..., seed={state['seed']}), "
                f"then loader.set_epoch({state['epoch']})); load_state_dict(state, strict=False) "
                f"resumes at the saved positions in the files as they are now"
            )
        if unchecked := unchecked_data(self.datapipe):
            warnings.warn(
                "this state is loaded without checking all the files it points into:\n  "
                + "\n  ".join(unchecked)
                + "\nKeep those files as they are until the epoch is over, or give the roots "
                "as a fixed list, IterableWrapper([root, ...]).list_files() or "
                "FileLister([root, ...]) (FSSpecFileLister for URLs), whose files the state "
                "records and checks (docs/storage.md); "
                "load_state_dict(state, strict=False) skips every check, this warning included",
                UserWarning,
                stacklevel=3,
            )

    # -- lifecycle ----------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop every worker; idempotent. Also called by ``with`` and garbage collection.

        Mid-epoch, the position is kept first: ``state_dict()`` afterwards resumes
        where the loader stopped (e.g. in a preemption handler: ``shutdown()``,
        then save ``state_dict()``).
        """
        self._shutdown(keep_position=True)

    def _release(self) -> None:
        """What dropping the last reference does: stop, keeping no position.

        Nobody can ask an unreachable loader for its state. A forked copy of
        the loader (in a worker process) never gets here (``ShutsDown``).
        """
        self._shutdown(keep_position=False)

    def _shutdown(self, *, keep_position: bool) -> None:
        if self._closed:
            return
        if self._steps.inside_a_step():
            # Called from inside a step (a signal handler): stop, but no exact position.
            return self._stop_when_the_step_ends(
                "shutdown() was called from inside a step of this loader (a signal handler "
                "that interrupted next(loader)?), so the position where it stopped is not "
                "exact; in the handler set a flag instead, and in the training loop call "
                "shutdown() and state_dict() before the next step"
            )
        stopped = stop_the_step(self._steps, self._waited_for, self._take_state)
        if not stopped.ended:  # next() in another thread runs on
            return self._stop_when_the_step_ends(stopped.why)
        self._final_state, self._final_error = stopped.state, stopped.error
        with self._steps.between():
            if self._closed:
                return
            interrupted = self._final_state is not None or self._final_error is not None
            if keep_position and self._current is not None and not interrupted:
                try:
                    self._final_state = self._take_state()
                except StateError as error:
                    self._final_error = error
            self._stop(close_items=True)

    def _stop_when_the_step_ends(self, why: str) -> None:
        self._final_error = StateError(why)
        self._closed = True
        if self._current is not None:
            self._current.invalidate(close_items=False)
        self._steps.defer(functools.partial(self._stop, close_items=True))

    def _waited_for(self) -> str | None:
        record = self._current
        return None if record is None else f"item {record.delivered} of epoch {record.epoch}"

    def _stop(self, *, close_items: bool) -> None:
        self._closed = True  # each part is stopped even if stopping another raised
        current, self._current = self._current, None
        with Steps() as steps:
            if current is not None:
                steps.run(current.invalidate, close_items)
            steps.run(self.reading_service.shutdown)
            if self._counters is not None:
                steps.run(self._counters.stop)

    def _blocks_taken(self, by: DataLoader, block: Any) -> None:
        """A loader built later over ``block`` of this pipeline runs it now (``_owners``)."""
        if self._closed:
            return
        self._taken = (
            f"this DataLoader's pipeline shares {block!r} with a DataLoader built after it, "
            f"which now runs it: two loaders over the same blocks would seed, restart and "
            f"read them for each other. Build the pipeline once per loader (a function that "
            f"returns it), or use only the newer loader"
        )
        current = self._current
        if current is not None:
            current.invalidate(close_items=False)  # its next() says why; its work stops later

    def _ensure_initialized(self) -> None:
        if not self._initialized:
            if self._counters is not None:  # before workers start: they report to it
                self._counters.start()
                if (tuned := tuned_in(self.reading_service)) is not None:
                    tuned.on_queues_change = WeakMethod(self._counters.count_queues)
            forget_shards(self.datapipe)  # an earlier loader ran it as one rank's share
            # Sources list their files here, once, so that workers started later share
            # the listing (every epoch, and the one a checkpoint records).
            data_fingerprint(self.datapipe, contents=False)
            with self._exporting_stats():
                self.reading_service.initialize(self.datapipe)
            self._initialized = True

    def _exporting_stats(self) -> AbstractContextManager[None]:
        """Worker processes started meanwhile report their statistics (with stats on)."""
        return nullcontext() if self._counters is None else self._counters.exporting()

    def _epoch_finished(self, record: Epoch) -> None:
        if self._current is record:
            self._current = None

    def __repr__(self) -> str:
        return f"DataLoader({self.datapipe!r}, {self.reading_service!r}, seed={self.seed})"
