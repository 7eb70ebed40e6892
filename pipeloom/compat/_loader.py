"""``pipeloom.compat.DataLoader``: torch's ``DataLoader`` signature on pipeloom's engine."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
import torch.utils.data
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data.dataloader import _InfiniteConstantSampler

from .. import loader as pipeloom_loader
from .._remote_shutdown import stop_the_step
from .._shutdown import ShutsDown, Steps
from .._steps import StepGate
from ..errors import StateError
from ._args import (
    ITERABLE_STRATEGY,
    MAP_STYLE_STRATEGY,
    check_dataset_args,
    check_worker_args,
    refuse_change,
    resolve_strategy,
    service_strategy_kwargs,
    start_method_of,
)
from ._catch_up import catch_up_after, torch_requests
from ._engine import (
    build_map_pipeline,
    build_pipeline,
    build_service,
    copies_dataset_once,
    why_not_per_item,
)
from ._iterator import CompatIterator, EpochRest
from ._live import draw_user_epoch
from ._plan import EpochPlan, PlanBoard, PlanEntries
from ._sampling import draw_base_seed, draw_epoch, is_known_sampler, settled_for_a_state
from ._state import STATE_VERSION, loader_fingerprint, python_rngs, read_state, sampler_generators
from ._worker import WorkerSetup

__all__ = ["DataLoader", "MAP_STYLE_STRATEGY", "ITERABLE_STRATEGY", "build_map_pipeline"]


class DataLoader(ShutsDown):
    """A drop-in ``torch.utils.data.DataLoader`` that runs on pipeloom's reading services.

    Takes torch's arguments and yields the batches torch yields: the sampler
    is iterated once per epoch in the main process, drawing from ``generator``
    (or torch's global RNG) in torch's order, so with the same seeds the
    batches -- indices, order and collated values -- are torch's.

    Extra arguments (keyword only):
        strategy: ``"classic"`` (the default: torch's design, so the batches
            are torch's, global-RNG draws in ``__getitem__`` included),
            ``"economic"`` or ``"chunked"`` (see ``MultiProcessingReadingService``).
            The last two fetch item by item and seed the global RNGs before
            each item from (base seed, epoch, position): draws are the same at any
            worker count, but they are not torch's per-worker streams.
        num_batch_workers, chunk_size: passed to the service's strategy.
        worker_type: ``"process"`` (default) or ``"thread"`` workers.

    Extras torch's loader has not: ``state_dict()`` / ``load_state_dict()``
    (resume mid-epoch), ``shutdown()`` and ``with``.

    Example:
        >>> import torch
        >>> from pipeloom.compat import DataLoader
        >>> loader = DataLoader(list(range(10)), batch_size=4, shuffle=True,
        ...                     generator=torch.Generator().manual_seed(0))
        >>> theirs = torch.utils.data.DataLoader(list(range(10)), batch_size=4, shuffle=True,
        ...                                      generator=torch.Generator().manual_seed(0))
        >>> all(torch.equal(a, b) for a, b in zip(loader, theirs)), len(loader)
        (True, 3)
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        strategy: str | None = None,
        num_batch_workers: int | None = None,
        chunk_size: int | None = None,
        worker_type: str = "process",
    ) -> None:
        check_worker_args(
            num_workers=num_workers,
            timeout=timeout,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            worker_type=worker_type,
            generator=generator,
        )
        iterable = isinstance(dataset, IterableDataset)
        check_dataset_args(
            iterable=iterable,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            drop_last=drop_last,
        )
        if iterable and num_workers > 0 and worker_type == "thread":
            raise ValueError(
                "an IterableDataset shards itself with torch.utils.data.get_worker_info(), "
                "which is per process, so worker threads would each read the whole dataset; "
                "use worker_type='process' or num_workers=0"
            )
        resolved_strategy = resolve_strategy(strategy, iterable, worker_type, num_workers)
        own_batch_sampler = batch_sampler is None and batch_size is not None
        if not iterable and resolved_strategy in ("economic", "chunked"):
            why_not = why_not_per_item(dataset, own_batch_sampler, in_order)
            if why_not and strategy is None:
                resolved_strategy = "classic"  # the default falls back to torch's design
            elif why_not:
                raise ValueError(
                    f"strategy={strategy!r} fetches items one by one and batches them after, "
                    f"but {why_not}; use strategy='classic' (or leave it unset)"
                )
        if sampler is None:
            if iterable:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        if batch_sampler is not None:
            batch_size, drop_last = None, False
        elif batch_size is not None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        auto_collation = batch_sampler is not None
        if collate_fn is None:
            data = torch.utils.data  # torch's own, as torch's loader shows them
            collate_fn = data.default_collate if auto_collation else data.default_convert
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        start_method_of(multiprocessing_context)

        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        self.collate_fn = collate_fn
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.persistent_workers = persistent_workers
        self.in_order = in_order
        self.strategy = resolved_strategy
        self.num_batch_workers = num_batch_workers
        self.chunk_size = chunk_size
        self.worker_type = worker_type
        self._iterable = iterable
        self._auto_collation = auto_collation
        self._own_batch_sampler = own_batch_sampler
        self._strategy_kwargs: dict[str, Any] = (
            service_strategy_kwargs(resolved_strategy, num_batch_workers, chunk_size)
            if num_workers > 0 and worker_type == "process"
            else {}
        )
        self._board = PlanBoard()
        if num_workers > 0 and worker_type == "process":
            self._board.share((prefetch_factor or 2) * num_workers)  # before any plan
        self._setup = WorkerSetup(self._board, dataset, worker_init_fn)
        self._engine: pipeloom_loader.DataLoader | None = None
        self._current: weakref.ref[CompatIterator] | None = None
        self._base_seed: int | None = None  # persistent workers keep their first one
        self._epochs = 0  # epochs begun: item_rng() draws from (base seed, epoch, position)
        self._resume: dict[str, Any] | None = None
        self._settle: Callable[[], None] | None = None  # draws due at the end of the epoch
        self._settle_at = 0  # the sampler request that makes them (see _sampling)
        self._ahead = (prefetch_factor or 0) * num_workers  # torch sends ahead
        # persistent classic worker processes carry their global RNG streams on, as torch's
        self._carries_streams = (
            persistent_workers
            and worker_type == "process"
            and (resolved_strategy == "classic" and num_workers > 0)
        )
        self._fingerprint = loader_fingerprint(
            dataset, sampler, batch_sampler, batch_size, drop_last
        )
        self._steps = StepGate()  # a checkpoint falls between two batches, from any thread
        self._final_state: dict[str, Any] | None = None  # taken by shutdown() mid-epoch
        self._final_error: StateError | None = None
        self._abandoned: EpochRest | None = None  # the rest of an epoch whose iterator was dropped
        self._initialized = True

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_initialized", False):  # some arguments are fixed by then
            refuse_change(name, value, self.__dict__.get(name))
        super().__setattr__(name, value)

    # -- torch's API --------------------------------------------------------------
    def __iter__(self) -> CompatIterator:
        with self._steps.between():
            self._final_state = self._final_error = None
            left = self._rest()  # an epoch left unfinished: what torch's iterator asked for
            self._close_current()
            self._end_engine_epoch()  # the workers go idle before the next plan is published
            plan, delivered = self._next_plan(left)
            if left is not None and self._engine is not None and self._carries_streams:
                plan = replace(plan, catch_up=catch_up_after(left, self._ahead, self._board.serial))
            self._publish(plan)
            if self._engine is not None and copies_dataset_once(self):
                # torch sends the dataset to new workers at every epoch: changes made to it
                # between epochs (a curriculum) must reach them, as under fork.
                self._stop_engine()
            iterator = CompatIterator(self, self._run(plan), plan, self._steps)
            self._current = weakref.ref(iterator)  # first: a shutdown() names the batch replayed
            iterator.replay(delivered)
            return iterator

    def __len__(self) -> int:
        if self._iterable:
            length = len(self.dataset)
            if self.batch_size is not None:
                length = (
                    length // self.batch_size if self.drop_last else -(-length // self.batch_size)
                )
            return length
        index_sampler = self.batch_sampler if self._auto_collation else self.sampler
        return len(index_sampler)

    # -- checkpoints (an extra) ---------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A snapshot to resume from: the epoch's remaining batches and the RNG states.

        Resuming (``load_state_dict`` on a loader built the same way, then
        ``iter()``) yields the rest of the interrupted epoch, then the same
        epochs the uninterrupted loader would. The sampler's random generators
        -- ``generator``, or torch's global RNG when it is None, and any
        ``generator`` a sampler holds -- are saved at their current state.

        Taken between two batches (from another thread it waits for the batch in
        progress); after ``shutdown()``, the position where the loader stopped.

        Raises:
            StateError: called from inside a step (a signal handler that
                interrupted ``next()``), or an exception escaped ``next()`` that
                the epoch cannot go on after (a dead worker, a timeout, an
                ``IterableDataset``). After a failed batch of a map-style dataset
                the state resumes with the batch after it, as ``next()`` would.
        """
        self._steps.refuse_inside_a_step("state_dict()")
        with self._steps.between():
            if self._final_error is not None:
                raise StateError(str(self._final_error)) from self._final_error
            if self._final_state is not None:
                return self._final_state
            return self._take_state()

    def load_state_dict(self, state: dict[str, Any], *, strict: bool = True) -> None:
        """Resume from :meth:`state_dict`: the next ``iter()`` continues that epoch.

        Args:
            state: what ``state_dict()`` returned.
            strict: refuse a state saved from a loader over another dataset or
                sampler (its fingerprint: their types and lengths, ``batch_size``,
                ``drop_last``); ``False`` loads it anyway.

        Raises:
            StateError: a field is damaged, or (``strict``) the dataset differs.
        """
        self._steps.refuse_inside_a_step("load_state_dict()")
        with self._steps.between():
            generators = self._generators()
            checked = read_state(
                state,
                kind="iterable" if self._iterable else "map",
                generators=len(generators),
                fingerprint=self._fingerprint,
                strict=strict,
                resumer=(self.num_workers, self.delivers_in_order, self.strategy != "classic"),
            )
            self._settle = None  # the saved generator states come after those draws
            for generator, saved in zip(generators, checked.generators):
                generator.set_state(saved)
            checked.restore_rngs()
            self._base_seed, self._epochs = checked.workers_base_seed, checked.epochs
            self._resume = checked.epoch
            self._final_state = self._final_error = None
            self._close_current()

    def _take_state(self) -> dict[str, Any]:
        with settled_for_a_state(self._settle, self._generators()):  # as when the epoch ends
            return self._state_now()

    def _state_now(self) -> dict[str, Any]:
        rest = self._rest()
        epoch = None if rest is None else rest.to_state()
        # __getitem__ draws from this process's RNGs in-process; the sampler, without a
        # generator, from torch's.
        saves_global = self.generator is None or self.num_workers == 0
        return {
            "version": STATE_VERSION,
            "kind": "iterable" if self._iterable else "map",
            "epoch": epoch,
            "workers_base_seed": self._base_seed,
            "epochs": self._epochs,
            "generators": [g.get_state() for g in self._generators()],
            "global_rng": torch.get_rng_state() if saves_global else None,
            "python_rngs": python_rngs() if self.num_workers == 0 else None,
            "fingerprint": dict(self._fingerprint),
        }

    # -- lifecycle ----------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the workers now (also done by ``with`` and garbage collection).

        Mid-epoch, the position is kept first: ``state_dict()`` afterwards
        resumes where the loader stopped (until the next ``iter()``).
        """
        if self._steps.inside_a_step():  # a signal handler interrupted next(loader)
            self._final_error = StateError(
                "shutdown() was called from inside a step of this loader (a signal handler "
                "that interrupted next(loader)?), so the position where it stopped is not "
                "exact; in the handler set a flag instead, and in the training loop call "
                "shutdown() and state_dict() before the next step"
            )
            self._steps.defer(self._stop_engine)  # as the interrupted step ends
            return
        stopped = stop_the_step(self._steps, self._waited_for, self._take_state)
        if not stopped.ended:  # next() in another thread runs on: stop as it returns
            self._final_error = StateError(stopped.why)
            if (current := self._live_current()) is not None:
                current.closed_why = "shutdown() stopped the loader"
            self._steps.defer(self._stop_engine)
            return
        self._final_state, self._final_error = stopped.state, stopped.error
        with self._steps.between():
            interrupted = self._final_state is not None or self._final_error is not None
            if not interrupted and self._rest() is not None:
                try:
                    self._final_state = self._take_state()
                except StateError as error:
                    self._final_error = error
            self._release()

    def _waited_for(self) -> str | None:
        current = self._live_current()
        if current is None or current.finished:
            return None
        return f"batch {current.next_batch()} of the epoch"

    def _release(self) -> None:
        """Close the epoch, stop the workers (even if closing raised); also when dropped."""
        with Steps() as steps:
            steps.run(self._board.stop_live)
            steps.run(self._close_current, "shutdown() stopped the loader")
            steps.run(self._stop_engine)

    def __repr__(self) -> str:
        return (
            f"pipeloom.compat.DataLoader({type(self.dataset).__name__}, "
            f"batch_size={self.batch_size}, num_workers={self.num_workers}, "
            f"strategy={self.strategy!r}, worker_type={self.worker_type!r})"
        )

    # -- internals ------------------------------------------------------------------
    def _live_current(self) -> CompatIterator | None:  # the epoch's, while its user holds it
        return self._current() if self._current is not None else None

    def _rest(self) -> EpochRest | None:
        """Where the unfinished epoch stopped, its iterator held or dropped (None: none)."""
        current = self._live_current()
        return current.rest() if current is not None else self._abandoned

    def keep_abandoned(self, rest: EpochRest | None) -> None:
        """The epoch's iterator was dropped unfinished: a checkpoint saves ``rest``."""
        self._abandoned = rest

    def _close_current(
        self, why: str = "a newer iter(loader) or load_state_dict() replaced it"
    ) -> None:
        current = self._live_current()
        if current is not None:
            current.close(why)
        self._current = self._abandoned = None

    def _next_plan(self, left: EpochRest | None = None) -> tuple[EpochPlan, int]:
        """Draw the epoch as torch's iterator does: ``iter(sampler)``, base seed, indices.

        ``left``: the previous epoch, if it was left unfinished: the draws torch's
        sampler makes after its last output are made only if torch asked that far.
        """
        if left is not None and torch_requests(left, self._ahead) < self._settle_at:
            self._settle = None
        self.settle_draws()
        resume, self._resume = self._resume, None
        if resume is not None:  # checked by read_state
            plan, delivered = resume["plan"], resume["delivered"]
            # an iterable dataset resumes by re-reading the batches delivered
            return (plan, delivered) if self._iterable else (plan.tail(delivered), 0)
        index_sampler = self.batch_sampler if self._auto_collation else self.sampler
        epoch, self._epochs = self._epochs, self._epochs + 1
        if self._iterable:
            self._draw_base_seed()
            return EpochPlan(PlanEntries(objects=[]), self._base_seed, epoch=epoch), 0  # type: ignore[arg-type]
        if is_known_sampler(index_sampler):
            # torch's samplers draw nothing at iter(): base seed, then the whole epoch, as
            # arrays (same calls on the same generators, without a Python list per index).
            self._draw_base_seed()
            drawn = draw_epoch(index_sampler)
            entries, self._settle, self._settle_at = drawn.entries, drawn.settle, drawn.settle_at
        else:
            iterator = iter(index_sampler)
            if self._draw_base_seed() and self.num_workers > 0:
                iterator = iter(index_sampler)  # _MultiProcessingDataLoaderIter._reset(first_iter)
            entries = draw_user_epoch(iterator, index_sampler, self._ahead)  # type: ignore[assignment]
        assert entries is not None and self._base_seed is not None
        return EpochPlan(entries, self._base_seed, epoch=epoch), 0

    def _publish(self, plan: EpochPlan) -> None:
        self._setup.base_seed = plan.base_seed
        self._board.publish(plan)  # the workers, persistent ones too, read it next epoch

    @property
    def is_iterable(self) -> bool:
        """True over an ``IterableDataset``."""
        return self._iterable

    @property
    def delivers_in_order(self) -> bool:
        """False when batches come in arrival order (``in_order=False`` with workers)."""
        return bool(self.in_order) or self.num_workers == 0

    def run_plan(self, plan: EpochPlan) -> Iterator[Any]:
        """The batches of ``plan`` (the rest of an epoch), in place of the epoch running."""
        self._end_engine_epoch()
        self._publish(plan)
        return self._run(plan)

    def _run(self, plan: EpochPlan) -> Iterator[Any]:
        """The engine's epoch for the published ``plan``: ``item_rng()`` follows its seeds."""
        engine = self._ensure_engine()
        engine.set_epoch(plan.engine_epoch)
        return iter(engine)

    def settle_draws(self) -> None:
        """Make the draws torch's sampler makes after the epoch's last index (see ``_sampling``)."""
        settle, self._settle = self._settle, None
        if settle is not None:
            settle()

    def _draw_base_seed(self) -> bool:
        """torch's ``_base_seed`` for a new iterator; persistent workers keep their first one."""
        if self.num_workers > 0 and self.persistent_workers and self._base_seed is not None:
            return False  # torch's _reset(): no new base seed
        self._base_seed = draw_base_seed(self.generator)
        return True

    def _generators(self) -> list[torch.Generator]:
        return sampler_generators(self.generator, self.sampler, self.batch_sampler)

    def _ensure_engine(self) -> pipeloom_loader.DataLoader:
        if self._engine is None:
            self._engine = pipeloom_loader.DataLoader(
                build_pipeline(self), build_service(self), seed=0
            )
        return self._engine

    def _end_engine_epoch(self) -> None:
        self._board.stop_live()  # workers waiting for a live plan's next output end now
        if self._engine is not None:
            self._engine.end_epoch()

    def _stop_engine(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()
