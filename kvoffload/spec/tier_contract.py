"""The contract of a secondary tier: a store behind the primary (CPU) tier.

The shape is vLLM 0.33's ``SecondaryTierManager`` (``vllm/v1/kv_offload/
tiering/base.py``), taken structurally: any object with these methods is a
tier, whether it subclasses vLLM's ABC, :class:`SecondaryTier` below, or
nothing. Data never flows between a tier and the GPU: a *cascade* (a store
job) copies pinned primary slots into the tier, a *promotion* (a load job)
copies tier chunks into primary slots allocated for it.

The per-key lifecycle of a tier, its jobs and its invariants are specified in
:mod:`kvoffload.spec.tier_model` (prose: ``docs/SPEC.md``, "Secondary
tiers").
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Protocol, runtime_checkable

import attrs

from kvoffload.spec.contract import (
    LookupResult,
    OffloadingEvent,
    ReqContext,
    RequestOffloadingContext,
)
from kvoffload.spec.keys import OffloadKey

#: A job's identifier, unique among the jobs submitted to one tier.
JobId = int


@attrs.frozen
class TierJob:
    """One transfer between the primary tier and a secondary tier.

    ``chunk_ids[i]`` is the primary slot of ``keys[i]``. For a store
    (``is_promotion=False``, a cascade) those slots are pinned and readable
    until the job's result is reported; for a load (``is_promotion=True``)
    they are allocated for the job and nobody else reads or writes them until
    then.
    """

    job_id: JobId
    keys: tuple[OffloadKey, ...]
    chunk_ids: tuple[int, ...]
    is_promotion: bool
    req_context: ReqContext = attrs.field(factory=ReqContext)


@attrs.frozen
class TierJobResult:
    """A finished job, reported exactly once by ``get_finished_jobs``.

    ``success`` is True when every key made it. On a partial failure
    ``success`` is False and ``successful_keys`` names the keys that did
    (a subset of the job's keys); ``None`` means every key shares the fate
    that ``success`` states.
    """

    job_id: JobId
    success: bool
    successful_keys: frozenset[OffloadKey] | None = None


class TierJobLike(Protocol):
    """What a tier reads of a job: kvoffload's :class:`TierJob` and vLLM's
    ``TransferJob`` both have it."""

    @property
    def job_id(self) -> int: ...

    @property
    def keys(self) -> Collection[OffloadKey]: ...

    @property
    def chunk_ids(self) -> Sequence[int]: ...

    @property
    def is_promotion(self) -> bool: ...


class TierJobResultLike(Protocol):
    """What a caller reads of a job's result (kvoffload's
    :class:`TierJobResult`, vLLM's ``JobResult``)."""

    @property
    def job_id(self) -> int: ...

    @property
    def success(self) -> bool: ...

    @property
    def successful_keys(self) -> Collection[OffloadKey] | None: ...


@runtime_checkable
class SecondaryTier(Protocol):
    """A secondary tier, structurally (vLLM 0.33's ``SecondaryTierManager``).

    Every method runs on the caller's thread and must not block on a copy:
    ``submit_store``/``submit_load`` queue the transfer and return; results
    come back through ``get_finished_jobs``. Callers never enter a tier
    concurrently (they hold the owning manager's lock), but completions may
    run on the tier's own threads.
    """

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT when ``key``'s chunk is stored and readable, MISS when it is
        not, RETRY when the tier cannot tell yet (ask again)."""
        ...

    def submit_store(self, job: TierJobLike) -> None:
        """Queue a cascade: copy the primary slots ``job.chunk_ids`` into the
        tier under ``job.keys`` (keys already present are skipped, others
        evicted to make room as the tier's policy decides)."""
        ...

    def submit_load(self, job: TierJobLike) -> None:
        """Queue a promotion: copy the tier's chunks of ``job.keys`` into the
        primary slots ``job.chunk_ids``."""
        ...

    def get_finished_jobs(self) -> Iterable[TierJobResultLike]:
        """The jobs finished since the last call, each reported once."""
        ...

    def drain_jobs(self) -> None:
        """Block until every submitted job has finished (its result is then
        available from ``get_finished_jobs``); never abort a copy midway."""
        ...

    def has_pending_work(self) -> bool:
        """True while a job is in flight or a result is not yet taken."""
        ...

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Mark ``keys`` recently used."""
        ...

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """A request the scheduler sees for the first time."""
        ...

    def on_request_finished(self, req_context: ReqContext) -> None:
        """A request ended; its jobs may still be in flight."""
        ...

    def take_events(self) -> Iterable[OffloadingEvent]:
        """Events for keys that became readable in, or left, this tier."""
        ...

    def shutdown(self) -> None:
        """Release threads, files and other resources."""
        ...
