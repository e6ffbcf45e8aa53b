"""An in-memory secondary tier: the reference tier for tests and simulation.

:class:`MemoryTier` speaks the :class:`~kvoffload.spec.tier_contract.SecondaryTier`
contract with a bounded, LRU-evicted dict of chunks. With a
``primary_kv_view`` (the primary's memory, one row per primary slot) it
copies bytes; without one it keeps keys only (what the simulator needs).

Jobs run when the caller says so: at submit (``complete_on_submit=True``,
the default, like vLLM's ``example`` tier) or on :meth:`MemoryTier.run_jobs`
(tests interleave completions with other calls that way). It starts no
thread.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable

import attrs

from kvoffload.impl.backend import require_positive_int
from kvoffload.spec.contract import (
    LookupResult,
    OffloadingEvent,
    ReqContext,
    RequestOffloadingContext,
)
from kvoffload.spec.errors import ConfigurationError, OffloadingError
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.tier_contract import TierJob, TierJobLike, TierJobResult


@attrs.frozen
class _Queued:
    job: TierJob
    is_store: bool


class MemoryTier:
    """``capacity_blocks`` chunks in memory, least recently used evicted first.

    A store skips keys already present and evicts least recently used chunks
    that no queued load still needs; a key that finds no room fails (the job
    then reports partial success). A load copies each present chunk into its
    primary row and fails the keys that are gone. Events (``medium``) say
    which keys became readable in the tier or left it.

    Raises :class:`ConfigurationError` for a capacity that is not a positive
    int, and :class:`OffloadingError` for a job id submitted twice.
    """

    def __init__(
        self,
        capacity_blocks: int,
        primary_kv_view: memoryview | None = None,
        *,
        medium: str = "MEMORY",
        block_size: int = 1,
        complete_on_submit: bool = True,
        enable_events: bool = True,
    ) -> None:
        self.capacity_blocks = require_positive_int("capacity_blocks", capacity_blocks)
        strides = None if primary_kv_view is None else primary_kv_view.strides
        if primary_kv_view is not None and (
            primary_kv_view.ndim != 2 or not strides or not primary_kv_view.c_contiguous
        ):
            raise ConfigurationError(
                "primary_kv_view must be a C-contiguous 2-D view (one row per slot)"
            )
        # the primary's memory as flat bytes; row i is chunk i
        self._flat = None if primary_kv_view is None else primary_kv_view.cast("B")
        self._chunk_bytes = strides[0] if strides else 0
        self.medium = medium
        self.block_size = require_positive_int("block_size", block_size)
        self.complete_on_submit = complete_on_submit
        # key -> its bytes (None when keys only); least recent first
        self._chunks: OrderedDict[OffloadKey, bytes | None] = OrderedDict()
        self._queue: list[_Queued] = []
        self._queued_ids: set[int] = set()
        # keys a queued load will read: not evicted until it ran
        self._load_pins: dict[OffloadKey, int] = {}
        self._finished: list[TierJobResult] = []
        self._events: list[OffloadingEvent] | None = [] if enable_events else None
        self.closed = False

    # --- queries ----------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if key in self._chunks else LookupResult.MISS

    def __contains__(self, key: object) -> bool:
        return key in self._chunks

    def keys(self) -> list[OffloadKey]:
        """The stored keys, least recently used first."""
        return list(self._chunks)

    def chunk(self, key: OffloadKey) -> bytes | None:
        """The bytes stored under ``key`` (None when absent or keys only)."""
        return self._chunks.get(key)

    def has_pending_work(self) -> bool:
        return bool(self._queue or self._finished)

    @property
    def jobs_queued(self) -> int:
        """Jobs submitted and not yet run."""
        return len(self._queue)

    # --- jobs -------------------------------------------------------------

    def submit_store(self, job: TierJobLike) -> None:
        self._submit(job, is_store=True)

    def submit_load(self, job: TierJobLike) -> None:
        self._submit(job, is_store=False)

    def _submit(self, job: TierJobLike, is_store: bool) -> None:
        if job.job_id in self._queued_ids:
            raise OffloadingError(f"job {job.job_id} submitted twice")
        frozen = TierJob(
            job.job_id, tuple(job.keys), tuple(int(c) for c in job.chunk_ids),
            job.is_promotion,
        )
        if len(frozen.keys) != len(frozen.chunk_ids):
            raise OffloadingError(f"job {job.job_id}: keys and chunk_ids differ in length")
        self._queued_ids.add(job.job_id)
        if not is_store:
            for key in frozen.keys:
                self._load_pins[key] = self._load_pins.get(key, 0) + 1
        self._queue.append(_Queued(frozen, is_store))
        if self.complete_on_submit:
            self.run_jobs()

    def run_jobs(self, count: int | None = None) -> int:
        """Run the first ``count`` queued jobs (all when None), in submission
        order; returns how many ran."""
        ran = 0
        while self._queue and (count is None or ran < count):
            queued = self._queue.pop(0)
            self._queued_ids.discard(queued.job.job_id)
            result = self._run_store(queued.job) if queued.is_store else self._run_load(queued.job)
            self._finished.append(result)
            ran += 1
        return ran

    def fail_job(self, job_id: int, successful_keys: Collection[OffloadKey] = ()) -> None:
        """Finish queued job ``job_id`` as a failure without running it: only
        ``successful_keys`` (a subset of its keys) are carried out. Raises
        :class:`OffloadingError` when no such job is queued."""
        for queued in self._queue:
            if queued.job.job_id == job_id:
                break
        else:
            raise OffloadingError(f"no queued job {job_id}")
        job = queued.job
        keep = frozenset(successful_keys)
        if not keep <= set(job.keys):
            raise OffloadingError("successful_keys must be keys of the job")
        self._queue.remove(queued)
        self._queued_ids.discard(job_id)
        partial = TierJob(
            job.job_id,
            tuple(k for k in job.keys if k in keep),
            tuple(c for k, c in zip(job.keys, job.chunk_ids) if k in keep),
            job.is_promotion,
        )
        if queued.is_store:
            done = self._run_store(partial)
        else:
            done = self._run_load(partial)
            for key in job.keys:
                if key not in keep:
                    self._unpin(key)
        made = done.successful_keys if done.successful_keys is not None else (
            frozenset(partial.keys) if done.success else frozenset()
        )
        self._finished.append(TierJobResult(job_id, False, frozenset(made)))

    def _run_store(self, job: TierJob) -> TierJobResult:
        made: set[OffloadKey] = set()
        stored: list[OffloadKey] = []
        evicted: list[OffloadKey] = []
        for key, chunk_id in zip(job.keys, job.chunk_ids):
            if key in self._chunks:
                self._chunks.move_to_end(key)
                made.add(key)
                continue
            if len(self._chunks) >= self.capacity_blocks:
                victim = next(
                    (k for k in self._chunks if k not in self._load_pins and k not in job.keys),
                    None,
                )
                if victim is None:
                    continue  # no room: this key fails
                del self._chunks[victim]
                evicted.append(victim)
            self._chunks[key] = self._read_row(chunk_id)
            made.add(key)
            stored.append(key)
        self._announce(evicted, removed=True)
        self._announce(stored, removed=False)
        return self._result(job, made)

    def _run_load(self, job: TierJob) -> TierJobResult:
        made: set[OffloadKey] = set()
        for key, chunk_id in zip(job.keys, job.chunk_ids):
            self._unpin(key)
            if key not in self._chunks:
                continue
            data = self._chunks[key]
            if self._flat is not None and data is not None:
                start = chunk_id * self._chunk_bytes
                self._flat[start:start + self._chunk_bytes] = data
            self._chunks.move_to_end(key)
            made.add(key)
        return self._result(job, made)

    def _read_row(self, chunk_id: int) -> bytes | None:
        if self._flat is None:
            return None
        start = chunk_id * self._chunk_bytes
        return bytes(self._flat[start:start + self._chunk_bytes])

    def _unpin(self, key: OffloadKey) -> None:
        left = self._load_pins.get(key, 0) - 1
        if left > 0:
            self._load_pins[key] = left
        else:
            self._load_pins.pop(key, None)

    @staticmethod
    def _result(job: TierJob, made: set[OffloadKey]) -> TierJobResult:
        if len(made) == len(set(job.keys)):
            return TierJobResult(job.job_id, True)
        return TierJobResult(job.job_id, False, frozenset(made))

    def _announce(self, keys: list[OffloadKey], removed: bool) -> None:
        if keys and self._events is not None:
            self._events.append(
                OffloadingEvent(tuple(keys), self.block_size, self.medium, removed)
            )

    def get_finished_jobs(self) -> list[TierJobResult]:
        taken, self._finished = self._finished, []
        return taken

    def drain_jobs(self) -> None:
        self.run_jobs()

    # --- housekeeping -----------------------------------------------------

    def evict(self, keys: Iterable[OffloadKey]) -> list[OffloadKey]:
        """Drop ``keys`` now (those present and not needed by a queued load),
        as the tier's own eviction would; returns the dropped keys."""
        dropped = [k for k in dict.fromkeys(keys) if k in self._chunks and k not in self._load_pins]
        for key in dropped:
            del self._chunks[key]
        self._announce(dropped, removed=True)
        return dropped

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in reversed(list(keys)):
            if key in self._chunks:
                self._chunks.move_to_end(key)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext(req_id=req_context.req_id)

    def on_request_finished(self, req_context: ReqContext) -> None:
        return None

    def take_events(self) -> list[OffloadingEvent]:
        if self._events is None:
            return []
        taken, self._events = self._events, []
        return taken

    def shutdown(self) -> None:
        self.drain_jobs()
        self.closed = True
