"""``DataLoader``: runs a pipeline, one epoch per ``iter()``, on a reading service."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ._shutdown import ShutsDown
from ._validate import check_bool, check_int
from .datapipes import (
    IterDataPipe,
    MapDataPipe,
    MapToIter,
    as_datapipe,
    seed_pipeline,
)
from .datapipes.runtime import check_declared_inputs
from .errors import StateError
from .graph import Placement
from .reading_service import InProcessReadingService, ReadingService

__all__ = ["DataLoader"]

_STATE_VERSION = 1


class DataLoader(ShutsDown):
    """Iterate a pipeline epoch after epoch, wherever its reading service runs it.

    Args:
        datapipe: the pipeline's last block (a torch ``Dataset``, a sequence or
            an iterable is wrapped; a map-style pipeline is read in index order).
        reading_service: where the blocks run; ``InProcessReadingService()``
            (the calling thread) by default.
        seed: makes every random block reproducible. ``None`` draws one seed
            from torch's default generator, so ``torch.manual_seed`` applies.
        resume_by_replay: when a block cannot save its state, ``state_dict()``
            raises naming it; with True it records instead how many items of
            the epoch were delivered, and a resumed loader re-reads and drops
            them (exact, but as slow as reading them again).

    Each ``iter(loader)`` is a new epoch (0, 1, 2, ...); ``set_epoch(n)`` picks
    the next one. With the same seed and epoch the items and their order are
    the same on every run and with every reading service.

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
        reading_service: ReadingService | None = None,
        *,
        seed: int | None = None,
        resume_by_replay: bool = False,
    ) -> None:
        pipeline = as_datapipe(datapipe)
        if isinstance(pipeline, MapDataPipe):
            pipeline = MapToIter(pipeline)
        assert isinstance(pipeline, IterDataPipe)
        check_declared_inputs(pipeline)
        if reading_service is None:
            reading_service = InProcessReadingService()
        elif not isinstance(reading_service, ReadingService):
            raise TypeError(
                f"reading_service must be a ReadingService such as "
                f"InProcessReadingService() or MultiProcessingReadingService(4), got "
                f"{type(reading_service).__name__}"
            )
        if seed is None:
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
        else:
            check_int("seed", seed, allow_none=True)
        seed = reading_service.agree_seed(seed)  # e.g. every rank takes rank 0's seed
        seed_pipeline(pipeline, seed)
        self.datapipe: IterDataPipe = pipeline
        self.reading_service = reading_service
        self.seed = seed
        self.resume_by_replay = check_bool("resume_by_replay", resume_by_replay)
        self._next_epoch = 0
        self._initialized = False
        self._closed = False
        self._current: _EpochIterator | None = None
        self._resume: dict[str, Any] | None = None

    # -- iteration -----------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise RuntimeError("this DataLoader was shut down; create a new one to iterate again")
        self._ensure_initialized()
        if self._current is not None:
            self._current.invalidate()
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        resume, self._resume = self._resume, None
        replayed = 0
        if resume is not None and resume.get("kind") == "replay":
            replayed = int(resume["delivered"])
            resume = None
        items = self.reading_service.start_epoch(epoch, resume)
        self._current = _EpochIterator(self, epoch, items)
        for _ in range(replayed):  # re-read and drop what was delivered before
            next(self._current, None)
        return self._current

    def __len__(self) -> int:
        """Items per epoch, when the pipeline knows it (else ``TypeError``)."""
        return len(self.datapipe)

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` run epoch ``epoch``."""
        self._next_epoch = check_int("epoch", epoch, minimum=0)

    @property
    def epoch(self) -> int:
        """The epoch being iterated (or the next one, between epochs)."""
        return self._current.epoch if self._current is not None else self._next_epoch

    def placement(self) -> Placement:
        """Which block runs where; ``print()`` it or call ``.to_dot()``."""
        self._ensure_initialized()
        return self.reading_service.placement()

    # -- checkpoints ------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A plain, picklable snapshot; ``load_state_dict`` on a new loader resumes here."""
        current = self._current
        if current is None:
            service_state = None
            epoch = self._next_epoch
        else:
            epoch = current.epoch
            try:
                service_state = self.reading_service.state_dict()
            except StateError:
                if not self.resume_by_replay:
                    raise
                service_state = {"kind": "replay", "delivered": current.delivered}
        return {
            "version": _STATE_VERSION,
            "seed": self.seed,
            "epoch": epoch,
            "service": service_state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``iter()`` continues that epoch."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            got = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise StateError(
                f"expected a DataLoader state of version {_STATE_VERSION}, got {got!r}; "
                f"pass what DataLoader.state_dict() returned"
            )
        self.seed = self.reading_service.agree_seed(state["seed"])
        seed_pipeline(self.datapipe, self.seed)
        self._next_epoch = state["epoch"]
        self._resume = state["service"]
        if self._current is not None:
            self._current.invalidate()
            self._current = None

    # -- lifecycle ----------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop every worker; idempotent. Also called by ``with`` and garbage collection."""
        if self._closed:
            return
        self._closed = True
        if self._current is not None:
            self._current.invalidate()
            self._current = None
        self.reading_service.shutdown()

    def _ensure_initialized(self) -> None:
        if not self._initialized:
            self.reading_service.initialize(self.datapipe)
            self._initialized = True

    def _epoch_finished(self, iterator: _EpochIterator) -> None:
        if self._current is iterator:
            self._current = None

    def __repr__(self) -> str:
        return f"DataLoader({self.datapipe!r}, {self.reading_service!r}, seed={self.seed})"


class _EpochIterator(Iterator[Any]):
    """One epoch's items; invalid once a newer epoch starts."""

    __slots__ = ("_loader", "epoch", "_items", "_valid", "delivered")

    def __init__(self, loader: DataLoader, epoch: int, items: Iterator[Any]) -> None:
        self._loader = loader
        self.epoch = epoch
        self._items = items
        self._valid = True
        self.delivered = 0

    def __next__(self) -> Any:
        if not self._valid:
            raise RuntimeError(
                f"this iterator over epoch {self.epoch} is no longer valid: a newer "
                f"iter(loader), load_state_dict() or shutdown() replaced it"
            )
        try:
            item = next(self._items)
        except StopIteration:
            self._valid = False
            self._loader._epoch_finished(self)
            raise
        self.delivered += 1
        return item

    def invalidate(self) -> None:
        self._valid = False
        close = getattr(self._items, "close", None)
        if close is not None:
            close()
