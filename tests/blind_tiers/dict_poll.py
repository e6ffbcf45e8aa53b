"""Design (a): an in-memory dict tier that completes its jobs at poll time.

``submit_store``/``submit_load`` only plan (reserve room, pin keys) and queue;
the copies run when the caller polls (``get_finished_jobs``) or drains, so
the caller's thread never copies inside a submit. Room is made first-in,
first-out among the stored keys that no queued load pins.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Collection, Iterable

import attrs

from tests.blind_tiers._common import (
    LookupResult,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    Rows,
    TierJobLike,
    TierJobResult,
    dedup_pairs,
    job_result,
)


@attrs.define
class _Queued:
    job_id: int
    keys: list[OffloadKey]
    is_load: bool
    copy: list[tuple[OffloadKey, int]]  # (key, primary row) to transfer
    skipped: list[OffloadKey]  # stores: present or already queued
    failed: list[tuple[OffloadKey, int]]  # stores: no room


class DictPollTier:
    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        if capacity_blocks < 0:
            raise ValueError("capacity_blocks must be >= 0")
        self._capacity = capacity_blocks
        self._rows = Rows(primary_kv_view)
        self._data: dict[OffloadKey, bytes] = {}  # insertion order = age
        self._reserved: set[OffloadKey] = set()
        self._pins: Counter[OffloadKey] = Counter()
        self._queue: deque[_Queued] = deque()
        self._results: list[TierJobResult] = []

    # -- lookups -----------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if key in self._data else LookupResult.MISS

    # -- submission ----------------------------------------------------------
    def _room_left(self) -> bool:
        return len(self._data) + len(self._reserved) < self._capacity

    def _victim(self, protect: Collection[OffloadKey]) -> OffloadKey | None:
        for key in self._data:
            if not self._pins[key] and key not in protect:
                return key
        return None

    def _make_room(self, protect: Collection[OffloadKey]) -> bool:
        while not self._room_left():
            victim = self._victim(protect)
            if victim is None:
                return False
            del self._data[victim]
        return True

    def submit_store(self, job: TierJobLike) -> None:
        pairs = dedup_pairs(job)
        queued = _Queued(job.job_id, [k for k, _ in pairs], False, [], [], [])
        offered = set(queued.keys)  # a job never evicts its own keys
        for key, row in pairs:
            if key in self._data or key in self._reserved:
                queued.skipped.append(key)
            elif self._make_room(offered):
                self._reserved.add(key)
                queued.copy.append((key, row))
            else:
                queued.failed.append((key, row))
        self._queue.append(queued)

    def submit_load(self, job: TierJobLike) -> None:
        keys = list(job.keys)
        rows = [int(c) for c in job.chunk_ids]
        for key in keys:
            self._pins[key] += 1
        self._queue.append(_Queued(job.job_id, keys, True, list(zip(keys, rows)), [], []))

    # -- completion ------------------------------------------------------------
    def _read_row(self, row: int) -> bytes:
        return self._rows.read(row)

    def _write_row(self, row: int, data: bytes) -> None:
        self._rows.write(row, data)

    def _finish_store(self, q: _Queued) -> TierJobResult:
        ok: list[OffloadKey] = []
        for key, row in q.copy:
            try:
                data = self._read_row(row)
            except (IndexError, ValueError):
                self._reserved.discard(key)
                continue
            self._reserved.discard(key)
            self._data[key] = data
            ok.append(key)
        ok.extend(k for k in q.skipped if k in self._data)
        return job_result(q.job_id, q.keys, ok)

    def _finish_load(self, q: _Queued) -> TierJobResult:
        ok: list[OffloadKey] = []
        for key, row in q.copy:
            data = self._data.get(key)
            if data is not None:
                try:
                    self._write_row(row, data)
                    ok.append(key)
                except (IndexError, ValueError):
                    pass
        for key, _ in q.copy:
            self._pins[key] -= 1
            if self._pins[key] <= 0:
                del self._pins[key]
        return job_result(q.job_id, q.keys, ok)

    def _run_queued(self) -> None:
        while self._queue:
            q = self._queue.popleft()
            self._results.append(self._finish_load(q) if q.is_load else self._finish_store(q))

    def get_finished_jobs(self) -> Iterable[TierJobResult]:
        self._run_queued()
        out, self._results = self._results, []
        return out

    def drain_jobs(self) -> None:
        self._run_queued()

    def has_pending_work(self) -> bool:
        return bool(self._queue or self._results)

    # -- the rest ----------------------------------------------------------------
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        return None

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext(req_id=req_context.req_id)

    def on_request_finished(self, req_context: ReqContext) -> None:
        return None

    def take_events(self) -> Iterable[object]:
        return ()

    def shutdown(self) -> None:
        self.drain_jobs()


# ---------------------------------------------------------------------------
# Defects: each a small subclass with one slip.


class ReportsTwice(DictPollTier):
    """Hands out the results list but forgets to empty it."""

    def get_finished_jobs(self) -> Iterable[TierJobResult]:
        self._run_queued()
        return list(self._results)


class StoreRowOffByOne(DictPollTier):
    """Reads primary row ``chunk_id + 1`` (treats row 0 as a header)."""

    def _read_row(self, row: int) -> bytes:
        return self._rows.read(row + 1)


class DrainDropsQueued(DictPollTier):
    """``drain_jobs`` cancels the queued jobs but reports no result for them."""

    def drain_jobs(self) -> None:
        for q in self._queue:
            for key, _ in q.copy:
                if q.is_load:
                    self._pins[key] -= 1
                else:
                    self._reserved.discard(key)
        self._queue.clear()


class FailedStoreIndexed(DictPollTier):
    """When no room could be made the key is reported failed, but the copy
    loop runs over every key of the job, so its bytes land in the index."""

    def _finish_store(self, q: _Queued) -> TierJobResult:
        result = super()._finish_store(q)
        for key, row in q.failed:
            self._data[key] = self._read_row(row)
        return result


class EvictsPinned(DictPollTier):
    """Picks the oldest key as victim even while a queued load pins it."""

    def _victim(self, protect: Collection[OffloadKey]) -> OffloadKey | None:
        return next((k for k in self._data if k not in protect), None)


class PendingIgnoresResults(DictPollTier):
    """``has_pending_work`` looks at the queue only, not at results not yet
    taken (so a drained tier says it is idle with results still to hand out)."""

    def has_pending_work(self) -> bool:
        return bool(self._queue)


class TruthinessOnChunkIds(DictPollTier):
    """Short-cuts empty jobs with ``if not job.keys or not job.chunk_ids``:
    fine for tuples, but vLLM hands ``chunk_ids`` as a numpy array, whose
    truth value is an error for two or more ids."""

    def submit_store(self, job: TierJobLike) -> None:
        if not job.keys or not job.chunk_ids:
            self._results.append(TierJobResult(job.job_id, True, None))
            return
        super().submit_store(job)

    def submit_load(self, job: TierJobLike) -> None:
        if not job.keys or not job.chunk_ids:
            self._results.append(TierJobResult(job.job_id, True, None))
            return
        super().submit_load(job)


def make(capacity_blocks: int, primary_kv_view: memoryview) -> DictPollTier:
    return DictPollTier(capacity_blocks, primary_kv_view)


def make_reports_twice(capacity_blocks: int, primary_kv_view: memoryview) -> DictPollTier:
    return ReportsTwice(capacity_blocks, primary_kv_view)


def make_store_row_off_by_one(capacity_blocks: int, primary_kv_view: memoryview) -> DictPollTier:
    return StoreRowOffByOne(capacity_blocks, primary_kv_view)


def make_drain_drops_queued(capacity_blocks: int, primary_kv_view: memoryview) -> DictPollTier:
    return DrainDropsQueued(capacity_blocks, primary_kv_view)


def make_failed_store_indexed(capacity_blocks: int, primary_kv_view: memoryview) -> DictPollTier:
    return FailedStoreIndexed(capacity_blocks, primary_kv_view)


def make_evicts_pinned(capacity_blocks: int, primary_kv_view: memoryview) -> DictPollTier:
    return EvictsPinned(capacity_blocks, primary_kv_view)


def make_pending_ignores_results(
    capacity_blocks: int, primary_kv_view: memoryview
) -> DictPollTier:
    return PendingIgnoresResults(capacity_blocks, primary_kv_view)


def make_truthiness_on_chunk_ids(capacity_blocks: int, primary_kv_view: memoryview) -> DictPollTier:
    return TruthinessOnChunkIds(capacity_blocks, primary_kv_view)
