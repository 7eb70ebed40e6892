"""Shard a pipeline across the ranks of a ``torch.distributed`` job."""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Sequence
from typing import Any

from ..._rank_pipelines import check_may_differ, digest, pipelines_differ, rank_description
from ..._validate import check_choice, check_seconds
from ...datapipes import IterDataPipe, StateFields
from ...errors import StateError
from ...graph import Placement, Plan
from ..distributed.elastic import held_states, rank_picture, rest_of_epoch
from ..distributed.job import Job, join_job
from ..distributed.rank_epoch import Progress, RankEpoch, check_start
from ..distributed.replicated import warn_replicated_sources
from .base import ReadingService
from .in_process import InProcessReadingService

__all__ = ["DistributedReadingService"]

_UNEVEN = ("shortest", "pad")
_END_CHECKS = ("auto", "length", "step")


class DistributedReadingService(ReadingService):
    """Give each rank of a ``torch.distributed`` job its own shard of every epoch.

    Rank ``r`` of ``w`` keeps shard ``r`` of ``w`` at the sharding point, so
    each item is read by exactly one rank per epoch. Every rank takes rank 0's
    seed, so what comes before the sharding point (e.g. a shuffle of the file
    list) is identical everywhere. Every rank yields the same number of items
    per epoch, so a training step with collectives never waits for a rank
    that ran out. Inside a rank, the pipeline runs in the calling thread; use
    ``SequentialReadingService(DistributedReadingService(), MultiProcessingReadingService(n))``
    to add workers (worker ``i`` of rank ``r`` keeps shard ``r * n + i`` of ``w * n``).

    Every rank must build the same pipeline over the same data: at each
    epoch's start the ranks compare their pipelines (a digest of each rank's
    fingerprint, in the exchange they make anyway) and all raise a
    ``ValueError`` naming the ranks, the block and the field that differ.
    What may differ is left out: each rank's shard, a device, a prefetch
    depth, a timeout (each block's ``per_rank_fields``); ``pipelines_may_differ``
    names more.

    Checkpoints: each rank's ``loader.state_dict()`` resumes that rank; the
    job's state, every rank's joined by
    :func:`~pipeloom.reading_service.merge_rank_states`, resumes on any number
    of ranks, the samples no rank delivered split among the new ones
    (``docs/language_models.md``, "Resuming on another number of ranks").

    The job is the initialized default process group, or one created from
    ``torchrun``'s environment variables; the loader talks on a gloo group of
    its own. With one rank the service does nothing.

    Args:
        uneven: when shards differ in size: ``"shortest"`` stops every rank when
            the first runs out (drops at most the difference; no item twice);
            ``"pad"`` goes on until the last runs out, the others repeating
            their shard from its start (every item at least once).
        end_check: how the ranks agree on the end: ``"length"`` compares the
            ranks' ``len()`` once per epoch (free per step); ``"step"`` sums a
            flag at every item (an all-reduce, ~0.1-0.5 ms on gloo), and also
            stops all ranks as soon as one raises; ``"auto"``: length when every
            rank's pipeline has a ``len()``, else step.
        timeout: seconds (or a ``timedelta``) a rank waits for the others in a
            collective before raising ``DistributedError``.
        group: a gloo process group to use as is, instead of the default one.
        pipelines_may_differ: what may differ between the ranks' pipelines
            besides what always may: ``"Block.field"`` names (e.g.
            ``["FileLister.roots"]`` for the same files under another mount
            point on each host), or True to skip the check.

    Example:
        >>> DistributedReadingService(uneven="pad", timeout=60)
        DistributedReadingService(uneven='pad', end_check='auto', timeout=60)
    """

    def __init__(
        self,
        uneven: str = "shortest",
        *,
        end_check: str = "auto",
        timeout: float | datetime.timedelta = 300.0,
        group: Any = None,
        pipelines_may_differ: bool | Sequence[str] = False,
    ) -> None:
        check_choice("uneven", uneven, _UNEVEN)
        check_choice("end_check", end_check, _END_CHECKS)
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        check_seconds("timeout", timeout, also="a datetime.timedelta")
        self.uneven = uneven
        self.end_check = end_check
        self.timeout = timeout
        self.group = group
        self.pipelines_may_differ = check_may_differ(
            pipelines_may_differ, "DistributedReadingService"
        )
        self.inner: ReadingService = InProcessReadingService()
        self._job: Job | None = None
        self._pipeline: IterDataPipe | None = None
        self._epoch: RankEpoch | None = None
        self._epoch_number = 0
        self._description: dict[str, Any] = {}  # of this rank's pipeline, at initialize()
        self._digest = 0

    def wrap(self, inner: ReadingService) -> None:
        """Run this rank's shard with ``inner`` (``SequentialReadingService`` calls it)."""
        if isinstance(inner, DistributedReadingService):
            raise ValueError(
                "a DistributedReadingService cannot run inside another one; use a single "
                "DistributedReadingService, followed by a thread or process service"
            )
        if self._pipeline is not None:
            raise RuntimeError("wrap() must come before the DataLoader initializes the service")
        self.inner = inner

    @property
    def rank(self) -> int:
        """This process's rank in the loader's group."""
        return self._require_job().rank

    @property
    def world_size(self) -> int:
        """The number of ranks sharing the data."""
        return self._require_job().world_size

    # -- ReadingService ------------------------------------------------------------
    @property
    def delivers_in_arrival_order(self) -> bool:
        return self.inner.delivers_in_arrival_order

    def agree_seed(self, seed: int) -> int:
        return self.inner.agree_seed(self._require_job().broadcast(seed))

    def check(self, pipeline: IterDataPipe) -> None:
        self._share_out()
        self.inner.check(pipeline)

    def initialize(self, pipeline: IterDataPipe) -> None:
        self._share_out()
        world_size = self._require_job().world_size
        if world_size > 1:  # alone: nothing to compare with, nothing read twice
            self._description = rank_description(pipeline, self.pipelines_may_differ)
            self._digest = digest(self._description)
            warn_replicated_sources(pipeline, world_size)
        self.inner.initialize(pipeline)
        self._pipeline = pipeline

    def _share_out(self) -> None:
        """Give the inner service this rank's share of the data."""
        job = self._require_job()
        if job.world_size > 1:
            self.inner.set_outer_sharding(job.world_size, job.rank)

    def start_epoch(self, epoch: int, state: dict[str, Any] | None = None) -> Iterator[Any]:
        job = self._require_job()
        if self._pipeline is None:
            raise RuntimeError("DistributedReadingService used before initialize(pipeline)")
        self._close_epoch()
        progress, inner_state = self._unpack(state, job)
        elastic = inner_state is not None and "rest" in inner_state
        length, failed = (-1, 0) if elastic else self._own_length()
        rows = job.gather([epoch, length, progress.delivered, failed, self._digest])
        self._check_pipelines(job, [row[4] for row in rows])
        # the rest of an epoch resumed on another number of ranks has no len(): agree by step
        end_check = "auto" if elastic else self.end_check
        target = check_start(rows, uneven=self.uneven, end_check=end_check)
        if job.world_size == 1:
            target = None  # nothing to agree on: pass every item through, no collectives
        self._epoch_number = epoch
        self._epoch = RankEpoch(
            lambda resume: self.inner.start_epoch(epoch, resume),
            job,
            uneven=self.uneven,
            target=target,
            progress=progress,
            state=inner_state,
        )
        return iter(self._epoch)

    def state_dict(self) -> dict[str, Any]:
        """This rank's state: each rank saves (and loads) its own, or every rank loads the
        job's state joined by :func:`merge_rank_states`, also on another number of ranks."""
        job = self._require_job()
        if self._epoch is None:
            raise RuntimeError("state_dict() needs a running epoch")
        progress = self._epoch.progress
        inner = self.inner.state_dict()
        return {
            "kind": "distributed",
            "rank": job.rank,
            "world_size": job.world_size,
            "delivered": progress.delivered,
            "own": progress.own,
            "padding": progress.padding,
            "inner": inner,
            "elastic": self._picture(),
        }

    def placement(self) -> Placement:
        inner = self.inner.placement()
        job = self._require_job()
        if isinstance(inner, Plan):
            return inner.with_rank(job.rank, job.world_size)
        where = f"rank {job.rank} of {job.world_size}"
        return Placement(inner.output, tuple((b, f"{where}, {loc}") for b, loc in inner.locations))

    def queues(self) -> Sequence[tuple[str, Any]]:
        return self.inner.queues()

    def shutdown(self) -> None:
        self._close_epoch()
        self.inner.shutdown()
        if self._job is not None:
            self._job.close()

    # -- helpers -------------------------------------------------------------------
    def _require_job(self) -> Job:
        if self._job is None:
            self._job = join_job(self.group, self.timeout)
        return self._job

    def _own_length(self) -> tuple[int, int]:
        """``(len of this rank's pipeline or -1, failed)``; never raises (the others wait)."""
        if self.end_check == "step":
            return -1, 0
        try:
            return len(self._pipeline), 0  # type: ignore[arg-type]
        except (TypeError, NotImplementedError):
            return -1, 0
        except Exception:  # noqa: BLE001 - the iteration will raise it again, on this rank
            return -1, 1

    def _check_pipelines(self, job: Job, digests: list[int]) -> None:
        """Raise on every rank when the ranks' pipelines differ (``pipeloom._rank_pipelines``):
        every rank sees the same digests, so all exchange the descriptions, or none."""
        if len(set(digests)) == 1:
            return
        descriptions = job.gather_objects(
            self._description, "exchange the descriptions of the ranks' pipelines"
        )
        raise ValueError(pipelines_differ(descriptions, "DistributedReadingService"))

    def _unpack(
        self, state: dict[str, Any] | None, job: Job
    ) -> tuple[Progress, dict[str, Any] | None]:
        if state is None:
            return Progress(), None
        if state.get("kind") == "distributed-job":  # every rank's state, merge_rank_states()
            state = self._own_part(state, job)
            if "rest" in state:  # resumed on another number of ranks
                return Progress(state["delivered"], state["delivered"], False), state
        if state.get("kind") != "distributed":
            raise StateError(
                f"this state was saved by a {state.get('kind', 'different')} reading service; "
                f"a DistributedReadingService resumes only its own states"
            )
        fields = StateFields("DistributedReadingService", state)
        saved = (fields.int("rank"), fields.int("world_size", minimum=1))
        if saved != (job.rank, job.world_size):
            raise StateError(
                f"this state is rank {saved[0]} of {saved[1]}'s, but this process is rank "
                f"{job.rank} of {job.world_size}; each rank loads the state it saved, with the "
                f"same number of ranks. To resume on another number of ranks (or without "
                f"knowing which rank saved what), gather every rank's state_dict() at the same "
                f"step, join them with merge_rank_states() and load the result on every rank"
            )
        progress = Progress(fields.int("delivered"), fields.int("own"), fields.bool("padding"))
        inner = state.get("inner")
        if not isinstance(inner, dict):
            fields.fail("inner", "the inner service's state (a dict)", inner)
        return progress, inner

    def _picture(self) -> dict[str, Any]:
        """This rank's frontier for a resume on other ranks; never fails the checkpoint."""
        try:
            return rank_picture(self.inner, self._epoch_number)
        except Exception as error:  # noqa: BLE001 - only an elastic resume needs it
            return {
                "group_size": 1,
                "frontier": 0,
                "skip": 0,
                "blocker": f"this rank could not describe its progress ({error!r})",
            }

    def _own_part(self, state: dict[str, Any], job: Job) -> dict[str, Any]:
        """This rank's state in the job's state; a new split of the rest on another count."""
        fields = StateFields("DistributedReadingService (job state)", state)
        world = fields.int("world_size", minimum=1)
        ranks = state.get("ranks")
        if not isinstance(ranks, list) or len(ranks) != world:
            ranks = fields.fail("ranks", f"{world} ranks' states", ranks)
        if world == job.world_size:
            return ranks[job.rank]
        rest = rest_of_epoch(ranks)
        held = held_states(ranks, job.world_size, job.rank, self.uneven)
        kinds = {(r.get("inner") or {}).get("kind") for r in ranks}
        delivered = StateFields("DistributedReadingService", ranks[0]).int("delivered")
        return {"kind": kinds.pop(), "rest": rest, "held": held, "delivered": delivered}

    def _close_epoch(self) -> None:
        if self._epoch is not None:
            self._epoch.close()
            self._epoch = None

    def __repr__(self) -> str:
        inner = "" if type(self.inner) is InProcessReadingService else f", inner={self.inner!r}"
        differ = self.pipelines_may_differ
        allowed = "" if differ is False else f", pipelines_may_differ={differ!r}"
        return (
            f"DistributedReadingService(uneven={self.uneven!r}, end_check={self.end_check!r}, "
            f"timeout={self.timeout:g}{allowed}{inner})"
        )
